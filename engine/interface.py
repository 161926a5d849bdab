"""The engine seam: the few types and methods the gateway and the controller see.

This module is pure Python on purpose (no vLLM, no torch): `gateway.control`
imports it, and the import-linter contract keeps vLLM out of everything but the
modules of `engine/` that need it. Modelled on TGI's three-method `Backend`
trait: generate a stream, abort, health, shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

#: Key of `SamplingParams.extra_args` that carries a request's speculation depth k
#: to the scheduler. Clients must never be able to set it (the gateway strips it).
SPEC_DEPTH_ARG = "specgw_k"
#: Key of `SamplingParams.extra_args` that lowers every request already in the engine
#: to at most this depth when the carrying request is added (never raises one): a
#: newcomer whose class has a batch floor brings the batch down to a depth it can
#: afford now, instead of waiting for its deeper batch-mates to finish. Gateway-only.
SPEC_CAP_ARG = "specgw_cap"
#: Key of `SamplingParams.extra_args` that carries the gateway's request id, so the
#: engine can hand the request's outcome back to the gateway.
GATEWAY_ID_ARG = "specgw_request_id"
#: Key of `SamplingParams.extra_args` that carries the request's class id, so the engine
#: can keep one acceptance estimator per class (`engine.vllm.confidence_budget`).
SPEC_CLASS_ARG = "specgw_class"
#: vLLM's own bound (`SamplingParams`): a temperature below it is greedy decoding.
GREEDY_EPS = 1e-5


def depth_arg(extra_args: Mapping[str, Any] | None, key: str) -> int | None:
    """`extra_args[key]` as a depth >= 0 (`SPEC_DEPTH_ARG`, `SPEC_CAP_ARG`); None when
    missing or not a number. Readers clamp it to their K."""
    if not extra_args or extra_args.get(key) is None:
        return None
    try:
        return max(0, int(extra_args[key]))
    except (TypeError, ValueError):
        return None


def token_steps(output_tokens: int, verify_steps: int, accepted_tokens: int) -> int:
    """Engine steps that produced a request's output tokens: the prefill's step (the first
    token), each verify step (a sampled token and its accepted drafts) and one plain decode
    step per other token. A last verify step whose tokens ran past `max_tokens` or a stop
    is cut, so the output can hold fewer than 1 + verify_steps + accepted_tokens: the
    prefill's step still counts. 0 without output."""
    if output_tokens <= 0:
        return 0
    return verify_steps + max(output_tokens - verify_steps - accepted_tokens, 1)


@dataclass(frozen=True, slots=True)
class SpeculationOutcome:
    """What speculation did for one finished request (vLLM's per-request metrics).

    `verify_steps` counts the engine steps in which at least one draft token was
    verified for this request; acceptance length follows vLLM's definition
    (bonus token included): 1 + accepted / verify_steps, and 1.0 with no steps.
    `accepted_per_position[d]` counts steps whose draft position d+1 was accepted
    (so it is non-increasing in d), which makes the depth profile
    P(accept d | accepted d-1) = accepted_per_position[d] / accepted_per_position[d-1].
    `drafted_per_position[d]` counts steps in which position d+1 was drafted.
    `tried_per_position[d]` counts steps in which position d+1 was drafted *and*
    positions 1..d were accepted: the trials of P(accept d+1 | accepted d). Where a
    request's steps drafted different depths (a per-step depth, a one-draft first
    step), only the joint count gives them; the two marginals above overcount them.
    """

    k: int
    verify_steps: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()
    drafted_per_position: tuple[int, ...] = ()
    tried_per_position: tuple[int, ...] = ()
    #: vLLM's `acceptance_histogram`: verify steps that accepted exactly j drafts, j = 0
    #: .. the engine's configured depth (empty: the engine has no drafter).
    acceptance_histogram: tuple[int, ...] = ()
    #: Accepted and drafted tokens of each verify step in order (vLLM's `detailed` level;
    #: empty at `summary`).
    per_step_accepted: tuple[int, ...] = ()
    per_step_drafted: tuple[int, ...] = ()

    @property
    def acceptance_length(self) -> float:
        if self.verify_steps <= 0:
            return 1.0
        return 1.0 + self.accepted_tokens / self.verify_steps


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """Everything the control plane learns from one finished request."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str | None
    speculation: SpeculationOutcome
    #: Seconds from arrival at the engine to the first output token.
    ttft_s: float = 0.0
    #: Mean seconds per output token after the first (0.0 with fewer than 2 tokens).
    tpot_s: float = 0.0
    #: Seconds from arrival at the engine to the last token.
    e2e_s: float = 0.0
    #: Number of engine steps that produced tokens for this request (decode steps).
    decode_steps: int = 0
    #: Prompt tokens served from the prefix cache (not prefilled again).
    cached_prompt_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One engine step as the engine core timed it (`engine.vllm.step_clock`).

    Requests in their prompt's prefill (a chunk of it, or all) are `prefill_*`; the
    others decode, each scheduling 1 + its verified drafts, so `decode_tokens` -
    `decode_requests` is the step's drafts. `seconds` is the core's period from the
    previous step's end to this one's, only sent while the core had work throughout.
    """

    seconds: float
    decode_requests: int
    decode_tokens: int
    prefill_requests: int = 0
    prefill_tokens: int = 0
    #: How the step's target forward ran: `FULL` or `PIECEWISE` CUDA graphs, or `NONE`
    #: (eager); None where the engine does not report it (vLLM's `cudagraph_metrics`).
    graph_mode: str | None = None

    def common_depth(self) -> int | None:
        """The drafts each decoding request verified, where all verified the same number
        (None: no decoding request, or their depths differed)."""
        requests = self.decode_requests
        drafts = self.decode_tokens - requests
        if requests <= 0 or drafts < 0 or drafts % requests:
            return None
        return drafts // requests

    def decoded_only(self, requests: int, tokens: int) -> bool:
        """Whether the step prefilled nothing and decoded exactly `requests` requests
        scheduling `tokens` tokens: then it ran the batch the caller knows, and its
        time is that batch's decode step (the cost model files only such steps)."""
        return (
            self.prefill_requests == 0
            and self.decode_requests == requests
            and self.decode_tokens == tokens
        )


#: Called on the gateway's event loop with every timed engine step.
StepListener = Callable[[EngineStep], None]


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One request to the engine, already tokenised or as a plain prompt."""

    request_id: str
    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    max_tokens: int = 64
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    #: Generate exactly `max_tokens` (measurements that need a fixed length).
    ignore_eos: bool = False
    #: Speculation depth for this request, 0..max_depth (0 = verify no drafts).
    k: int = 0
    extra: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GenerationChunk:
    """An increment of one request's output; the last one carries the outcome."""

    request_id: str
    text_delta: str
    token_ids_delta: tuple[int, ...]
    finished: bool = False
    finish_reason: str | None = None
    outcome: RequestOutcome | None = None


@dataclass(frozen=True, slots=True)
class EngineHealth:
    """Liveness and readiness, separately: a wedged engine is alive but not ready."""

    alive: bool
    ready: bool
    detail: str = ""
    running_requests: int = 0
    waiting_requests: int = 0
    #: Seconds since the engine last produced output while it had work (0 when idle).
    stalled_for_s: float = 0.0


class ErrorClass(StrEnum):
    """The closed set of classes a backend's errors fall in. A backend translates its
    engine library's errors into these once (vLLM's: `engine.vllm.errors`); the gateway
    maps each to one of its own error kinds (`gateway.errors.from_engine`)."""

    INVALID_REQUEST = "invalid_request"
    NOT_FOUND = "not_found"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    NOT_READY = "not_ready"
    ENGINE_ERROR = "engine_error"


class EngineError(Exception):
    """The engine failed a request (engine core died, aborted, or rejected it).

    `kind` is its class; `param`, where set, the request field at fault.
    """

    def __init__(
        self,
        message: str = "",
        *,
        kind: ErrorClass = ErrorClass.ENGINE_ERROR,
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.param = param


class InvalidRequestError(EngineError):
    """The engine's request validation refused the request (a client error, 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message, kind=ErrorClass.INVALID_REQUEST, param=param)


class EngineDeadError(EngineError):
    """The engine core process is gone; every in-flight request fails."""


@runtime_checkable
class Engine(Protocol):
    """The seam: generate a stream for one request, abort, health, shutdown."""

    @property
    def max_depth(self) -> int:
        """K: the largest speculation depth a request can get (0 = no drafter)."""
        ...

    @property
    def lossless_sampling(self) -> bool:
        """Whether speculation keeps sampled (temperature > 0) outputs distributed as the
        target's own; where it does not, the gateway runs sampled requests at k = 0."""
        ...

    @property
    def one_depth_per_step(self) -> bool:
        """Whether every drafting request of a step verifies the step's one depth (CUDA's
        FULL decode graphs, `engine.vllm.batch_depth`): where so, the gateway's `step_rule`
        setting `auto` lets the engine pick that depth (`engine.step_rule`)."""
        ...

    def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        """Stream one request's output; the final chunk has `finished` and `outcome`."""
        ...

    async def abort(self, request_id: str) -> None: ...

    async def health(self) -> EngineHealth: ...

    async def reset_prefix_cache(self) -> bool:
        """Drop every cached prefix block; False (nothing dropped) while requests hold blocks."""
        ...

    def on_step(self, listener: StepListener | None) -> None:
        """Hear every timed engine step from now on (None: stop); an engine that does not
        time its steps never calls it, and the cost model learns from requests alone."""
        ...

    async def shutdown(self) -> None: ...


@runtime_checkable
class EngineProbe(Protocol):
    """An engine that answers a round trip with no request: the gateway's idle canary
    (`gateway.engine_watch`) finds a stopped or wedged engine core with it."""

    async def ping(self) -> None:
        """Return once the engine core answered; raise `EngineDeadError` when it is gone.
        Unbounded here: the caller sets the deadline."""
        ...
