"""A scripted in-process engine with the `Engine` seam, for fast controller and gateway tests.

Real code, not a mock (httpx's `MockTransport` is the model): it passes the same
contract tests as `VLLMEngine` (tests/engine/contract.py). What it simulates:

* Tokens are a deterministic function of the prompt and the position only, so
  greedy output does not depend on k (as with real speculative decoding).
* Each verify step drafts k tokens and accepts a prefix: position d+1 is
  accepted with probability `p[d]` given positions 1..d were, where `p` comes
  from the first `AcceptanceScript` whose marker occurs in the prompt. One step
  yields accepted + 1 tokens. k = 0 steps record no verify step (vLLM's rule). The
  outcome carries vLLM's per-request counts as its scheduler keeps them: the acceptance
  histogram over the engine's depth and, at `spec_decode_metrics: detailed`, each step's
  accepted and drafted tokens (`engine.spec_decode_report` writes the response block).
* Each step sleeps `StepTimeModel(k, batch)` seconds, batch = streams in flight.
  With `modelled_latency` the outcome's latencies are the sum of those seconds, not
  the wall clock's, so what the gateway learns from them is free of the host's stalls.
* `kill()` plays the engine core dying: every in-flight and later request fails
  with `EngineDeadError`; `wedge()` / `resume()` play SIGSTOP / SIGCONT of the core
  (steps and `ping` wait in between).
* As `VLLMEngine` does for the gateway's serving layer, a request carrying the
  gateway's id (`GATEWAY_ID_ARG` in `extra`) resolves its outcome in the engine's
  `outcome_tap` (`engine.outcomes`) before its last chunk is yielded, None where its
  stream ends without one, and one carrying `SPEC_CAP_ARG` lowers the
  requests already running to at most that depth as it is added. A voter of the step
  rule (`engine.step_rule`) runs at the rule's depth for its class alone, at most its k.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Literal

from engine.interface import (
    GATEWAY_ID_ARG,
    SPEC_CAP_ARG,
    EngineDeadError,
    EngineHealth,
    GenerateRequest,
    GenerationChunk,
    InvalidRequestError,
    RequestOutcome,
    SpeculationOutcome,
    StepListener,
    token_steps,
)
from engine.outcomes import OutcomeTap
from engine.step_rule import (
    SPEC_COSTS_ARG,
    SPEC_VOTE_ARG,
    StepCostTable,
    StepVote,
    vote_step_depth,
)


@dataclass(frozen=True, slots=True)
class AcceptanceScript:
    """Per-position acceptance P(accept d+1 | accepted 1..d) for prompts containing `marker`."""

    marker: str
    per_position: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """Seconds per engine step: base + per_draft * k + per_seq * (batch - 1)."""

    base_s: float = 0.002
    per_draft_s: float = 0.0005
    per_seq_s: float = 0.0002

    def __call__(self, k: int, batch: int) -> float:
        return self.base_s + self.per_draft_s * k + self.per_seq_s * max(batch - 1, 0)


@dataclass
class FakeEngineConfig:
    max_depth: int = 4
    scripts: tuple[AcceptanceScript, ...] = ()
    default_acceptance: tuple[float, ...] = (0.7, 0.6, 0.5, 0.4)
    step_time: Callable[[int, int], float] = field(default_factory=StepTimeModel)
    vocab: int = 1000
    #: Token id that ends a completion early when generated (None = never).
    eos_token: int | None = None
    max_prompt_tokens: int = 4096
    #: Report TTFT, TPOT and e2e as the sum of the steps' `step_time`, not as measured:
    #: a test of what the cost model learns from them, on a loaded host, where one
    #: scheduling stall in a 2 ms step would move a depth's price by a multiple.
    modelled_latency: bool = False
    #: vLLM's per-request spec-decode metrics level (`engine.per_request_metrics`):
    #: `detailed` also records each verify step's accepted and drafted tokens.
    spec_decode_metrics: Literal["summary", "detailed"] = "detailed"


@dataclass
class _Running:
    """A request in the engine: its depth now (a later request's cap may lower it)."""

    k: int
    aborted: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _Accounting:
    """One request's verify steps, counted as vLLM's scheduler counts them: a histogram
    over the engine's depth (`depth`: none without a drafter), per-step lists if
    `detailed`."""

    k: int
    depth: int = 0
    detailed: bool = False
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    accepted_pos: list[int] = field(default_factory=list)
    drafted_pos: list[int] = field(default_factory=list)
    tried_pos: list[int] = field(default_factory=list)
    histogram: list[int] = field(default_factory=list)
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_pos = [0] * self.k
        self.drafted_pos = [0] * self.k
        self.tried_pos = [0] * self.k
        self.histogram = [0] * (self.depth + 1) if self.depth else []

    def verify(self, k: int, accepted: int) -> None:
        self.steps += 1
        self.drafted += k
        self.accepted += accepted
        if self.histogram:
            self.histogram[accepted] += 1
        if self.detailed:
            self.per_step_accepted.append(accepted)
            self.per_step_drafted.append(k)
        for d in range(k):
            self.drafted_pos[d] += 1
            if d <= accepted:
                self.tried_pos[d] += 1
            if d < accepted:
                self.accepted_pos[d] += 1

    def outcome(self) -> SpeculationOutcome:
        return SpeculationOutcome(
            k=self.k,
            verify_steps=self.steps,
            draft_tokens=self.drafted,
            accepted_tokens=self.accepted,
            accepted_per_position=tuple(self.accepted_pos),
            drafted_per_position=tuple(self.drafted_pos) if self.steps else (),
            tried_per_position=tuple(self.tried_pos) if self.steps else (),
            acceptance_histogram=tuple(self.histogram),
            per_step_accepted=tuple(self.per_step_accepted),
            per_step_drafted=tuple(self.per_step_drafted),
        )


class FakeEngine:
    """Scripted `Engine`; see the module docstring for what it simulates."""

    def __init__(self, config: FakeEngineConfig | None = None) -> None:
        self.config = config or FakeEngineConfig()
        #: The outcomes its serving port waits for (`engine.outcomes`).
        self.outcome_tap = OutcomeTap()
        self._running: dict[str, _Running] = {}
        self._dead = False
        self._closed = False
        #: Cleared while the engine core is stopped (`wedge`): steps and pings wait.
        self._awake = asyncio.Event()
        self._awake.set()
        self.outcomes: list[RequestOutcome] = []

    @property
    def max_depth(self) -> int:
        return self.config.max_depth

    @property
    def lossless_sampling(self) -> bool:
        return True

    @property
    def one_depth_per_step(self) -> bool:
        return False  # each request runs at its own depth

    def acceptance_for(self, prompt: str) -> tuple[float, ...]:
        for script in self.config.scripts:
            if script.marker in prompt:
                return script.per_position
        return self.config.default_acceptance

    def token_at(self, prompt: str, position: int) -> int:
        digest = hashlib.blake2b(f"{prompt}\x00{position}".encode(), digest_size=4).digest()
        return int.from_bytes(digest, "big") % self.config.vocab

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[GenerationChunk, None]:
        gateway_id = request.extra.get(GATEWAY_ID_ARG)
        try:
            async with aclosing(self._generate(request)) as chunks:
                async for chunk in chunks:
                    yield chunk
        finally:
            if isinstance(gateway_id, str):
                self.outcome_tap.resolve(gateway_id, None)  # no outcome came: None

    async def _generate(self, request: GenerateRequest) -> AsyncGenerator[GenerationChunk, None]:
        if self._dead or self._closed:
            raise EngineDeadError("fake engine is dead")
        prompt = request.prompt or " ".join(map(str, request.prompt_token_ids or ()))
        prompt_tokens = len(request.prompt_token_ids or prompt.split())
        if request.max_tokens < 1 or prompt_tokens > self.config.max_prompt_tokens:
            raise InvalidRequestError("max_tokens must be >= 1 and the prompt must fit")
        if request.request_id in self._running:
            raise InvalidRequestError(f"duplicate request id {request.request_id}")
        cap = request.extra.get(SPEC_CAP_ARG)
        if isinstance(cap, int):
            for running in self._running.values():
                running.k = min(running.k, cap)
        state = _Running(self._depth_of(request))
        self._running[request.request_id] = state
        try:
            async for chunk in self._stream(request, prompt, prompt_tokens, state):
                yield chunk
        finally:
            self._running.pop(request.request_id, None)

    def _depth_of(self, request: GenerateRequest) -> int:
        """Its k, or for a voter (`engine.step_rule`) the rule's depth for its class
        beside the requests running at k = 0 (riders, as the vLLM scheduler counts them)
        at admission, at most its k: the fake runs each request on its own, not in steps,
        so a rider (`StepVote.rides`) has no voters to ride with and runs at 0."""
        k = max(0, min(request.k, self.max_depth))
        vote = StepVote.from_arg(request.extra.get(SPEC_VOTE_ARG))
        costs = StepCostTable.from_arg(request.extra.get(SPEC_COSTS_ARG))
        if k == 0 or vote is None or costs is None:
            return k
        riders = sum(1 for running in self._running.values() if running.k == 0)
        depth = vote_step_depth([vote], costs, len(self._running) + 1, False, riders=riders)
        return min(k, depth)

    async def _stream(
        self, request: GenerateRequest, prompt: str, prompt_tokens: int, state: _Running
    ) -> AsyncIterator[GenerationChunk]:
        k = state.k
        rng = random.Random(f"{request.request_id}/{prompt}")
        probs = self.acceptance_for(prompt)
        config = self.config
        acct = _Accounting(k, config.max_depth, config.spec_decode_metrics == "detailed")
        start = time.monotonic()
        first_token_at = last_token_at = start
        modelled_s = 0.0
        produced = 0
        finish: str | None = None
        while finish is None:
            step_k = 0 if produced == 0 else state.k  # the prefill step verifies no drafts
            step_s = self.config.step_time(step_k, len(self._running))
            modelled_s += step_s
            await asyncio.sleep(step_s)
            await self._awake.wait()
            if self._dead:
                raise EngineDeadError("fake engine core died")
            if state.aborted.is_set():
                finish = "abort"
                break
            accepted = 0
            while accepted < step_k and rng.random() < probs[min(accepted, len(probs) - 1)]:
                accepted += 1
            if step_k:
                acct.verify(step_k, accepted)
            new = [self.token_at(prompt, produced + i) for i in range(accepted + 1)]
            new = new[: request.max_tokens - produced]
            if self.config.eos_token is not None and self.config.eos_token in new:
                new = new[: new.index(self.config.eos_token) + 1]
                finish = "stop"
            produced += len(new)
            last_token_at = start + modelled_s if self.config.modelled_latency else time.monotonic()
            if produced == len(new):
                first_token_at = last_token_at
            if finish is None and produced >= request.max_tokens:
                finish = "length"
            if finish is None:
                yield self._chunk(request, new)
        outcome = RequestOutcome(
            request_id=request.request_id,
            prompt_tokens=prompt_tokens,
            output_tokens=produced,
            finish_reason=finish,
            speculation=acct.outcome(),
            ttft_s=first_token_at - start,
            tpot_s=(last_token_at - first_token_at) / (produced - 1) if produced > 1 else 0.0,
            e2e_s=last_token_at - start,
            decode_steps=token_steps(produced, acct.steps, acct.accepted),
        )
        self.outcomes.append(outcome)
        gateway_id = request.extra.get(GATEWAY_ID_ARG)
        if isinstance(gateway_id, str):
            self.outcome_tap.resolve(gateway_id, outcome)
        last = [] if finish == "abort" else new
        yield self._chunk(request, last, finish=finish, outcome=outcome)

    @staticmethod
    def _chunk(
        request: GenerateRequest,
        tokens: list[int],
        finish: str | None = None,
        outcome: RequestOutcome | None = None,
    ) -> GenerationChunk:
        return GenerationChunk(
            request_id=request.request_id,
            text_delta="".join(f" t{t}" for t in tokens),
            token_ids_delta=tuple(tokens),
            finished=finish is not None,
            finish_reason=finish,
            outcome=outcome,
        )

    async def abort(self, request_id: str) -> None:
        running = self._running.get(request_id)
        if running is not None:
            running.aborted.set()

    async def reset_prefix_cache(self) -> bool:
        """The fake keeps no KV cache: there is nothing to drop, except while requests run."""
        return not self._running and not self._dead and not self._closed

    def on_step(self, listener: StepListener | None) -> None:
        """The fake times no steps: its cost model learns from finished requests alone."""

    async def health(self) -> EngineHealth:
        alive = not self._dead and not self._closed
        return EngineHealth(
            alive=alive,
            ready=alive,
            detail="" if alive else "engine core died" if self._dead else "shut down",
            running_requests=len(self._running) if alive else 0,
        )

    def request_counts(self) -> tuple[int, int, float]:
        """(running, waiting, report time) like `VLLMEngine.request_counts`."""
        return len(self._running), 0, time.monotonic()

    async def ping(self) -> None:
        """A round trip to the engine core: it waits while the core is stopped (`wedge`)."""
        if self._dead or self._closed:
            raise EngineDeadError("fake engine is dead")
        await self._awake.wait()

    def kill(self) -> None:
        """Simulate the engine core dying."""
        self._dead = True

    def wedge(self) -> None:
        """Simulate a stopped engine core (SIGSTOP): steps and pings wait for `resume`."""
        self._awake.clear()

    def resume(self) -> None:
        """Simulate SIGCONT: the stopped core carries on where it was."""
        self._awake.set()

    async def shutdown(self) -> None:
        self._closed = True
        for running in self._running.values():
            running.aborted.set()
        self.outcome_tap.close()
