"""What the service hands the routes and the telemetry: replies, a request's end, a whole
answer with its speculation report (`gateway.speculation_report`)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from engine.interface import EngineDeadError, EngineError, EngineStep, RequestOutcome
from engine.protocol import ResponsesResponse
from gateway.control.plane import Plan
from gateway.errors import ErrorKind, GatewayError, from_engine
from gateway.request_clock import RequestClock
from gateway.speculation_report import SpeculationReport

R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Finished:
    """One request's end, as telemetry sees it (no prompt or completion text)."""

    endpoint: str
    plan: Plan
    status: str
    error: GatewayError | None
    outcome: RequestOutcome | None
    e2e_s: float
    #: A stream's first answer chunk, in seconds from the request's arrival at the
    #: gateway (None: not a stream, or no chunk came).
    ttft_s: float | None
    stream: bool
    #: Arrival, admission wait and admission (`gateway.request_clock`).
    clock: RequestClock | None = None


class Telemetry(Protocol):
    def request_finished(self, finished: Finished) -> None: ...

    def request_shed(self, endpoint: str, error: GatewayError) -> None: ...

    def request_refused(self, endpoint: str, error: GatewayError) -> None: ...

    def engine_step(self, filed: bool, step: EngineStep) -> None: ...


@dataclass(slots=True)
class JsonReply:
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(slots=True)
class StreamReply:
    """An SSE stream plus an idempotent `finalize` the response must call when done."""

    chunks: AsyncGenerator[str, None]
    headers: dict[str, str]
    finalize: Callable[[], Awaitable[None]] = field(repr=False)


def json_body(result: Any) -> dict[str, Any]:
    """A reply as JSON: a Responses answer as vLLM's route writes it (by alias, nulls kept,
    as OpenAI's API does); chat and completions without nulls."""
    if isinstance(result, ResponsesResponse):
        return result.model_dump(mode="json", by_alias=True)
    body: dict[str, Any] = result.model_dump(exclude_none=True)
    return body


#: A request the engine aborted (drain deadline) is an error, never a finished answer.
ABORTED = "The request was aborted before it finished."


async def engine_reply(call: Callable[[str], Awaitable[R]], gid: str, span: Any) -> R:
    """The backend's answer to `call(gid)`, under the request's trace context; its errors
    (in the backend's closed set, `engine.port`) as the gateway's. A dead engine's error
    propagates: the engine watch and the supervisor handle that."""
    try:
        with span.current():  # its trace context goes to the engine
            return await call(gid)
    except EngineDeadError:
        raise
    except EngineError as exc:
        raise from_engine(exc) from None


def whole_answer(
    result: Any, report: SpeculationReport, outcome: RequestOutcome | None
) -> dict[str, Any]:
    """A whole (not streamed) answer's body with its speculation report, written from the
    request's `outcome` (the port's, resolved before the answer was returned); an
    aborted answer is an error."""
    if any(c.finish_reason == "abort" for c in getattr(result, "choices", ())):
        raise GatewayError(ErrorKind.ENGINE_ERROR, ABORTED)
    if outcome is not None and outcome.finish_reason == "abort":
        raise GatewayError(ErrorKind.ENGINE_ERROR, ABORTED)  # a Responses answer
    return report.write(json_body(result), outcome)
