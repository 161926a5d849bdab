"""Relays a Responses API event stream under the nothing-lost contract.

As for chat (`gateway.streaming.relay`), every stream ends in exactly one terminal
state: vLLM's `response.completed` event, whose `response` carries the speculation
report (`gateway.speculation_report`; OpenAI's clients keep a field they do not know:
`Response.model_extra`), or
one `error` event in OpenAI's shape (`ResponseErrorEvent`; its `code` is the
gateway's error label), so no client takes a cut stream for an answer. A Responses
stream has no `[DONE]`: `response.completed` is its end.

Errors: the backend's failure, raised from its stream (`engine.port`); no event for
`idle_timeout_s` (`stream_stalled`); a stream that stops before `response.completed`;
and an engine abort (drain deadline), which vLLM's non-harmony path also ends with
`response.completed`, told apart by the request's outcome (`aborted`). Closing this
generator closes vLLM's, which aborts the engine request.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any

from engine.responses_wire import error_sse
from gateway.errors import ErrorKind, GatewayError
from gateway.streaming import IdleWatch, ReportWriter, StreamEnd, next_or_end, relay

_COMPLETED = "event: response.completed\n"
#: Events sent before the engine produced anything: not the first answer chunk.
_OPENING = ("event: response.created\n", "event: response.in_progress\n")
_DATA = "\ndata: "


def _payload(event: str) -> dict[str, Any]:
    return dict(json.loads(event[event.index(_DATA) + len(_DATA) :]))


def error_event(error: GatewayError, sequence_number: int) -> str:
    """The gateway's in-stream error, in OpenAI's `error` event shape."""
    return error_sse(
        error.message, code=error.kind.label, sequence_number=sequence_number, param=error.param
    )


async def with_report(event: str, report: ReportWriter) -> str:
    """`response.completed` with the speculation report on its `response`."""
    payload = _payload(event)
    payload["response"] = await report(payload["response"])
    data = json.dumps(payload, separators=(",", ":"))
    return f"{_COMPLETED}data: {data}\n\n"


async def relay_events(
    source: AsyncIterator[str],
    *,
    idle_timeout_s: float,
    report: ReportWriter,
    aborted: Callable[[], bool],
    on_end: Callable[[StreamEnd], Awaitable[None]],
) -> AsyncGenerator[str, None]:
    """`aborted` is asked after `report` (which waits for the request's outcome)."""
    end = StreamEnd()
    sent = 0
    iterator = aiter(source)
    watch = IdleWatch(idle_timeout_s)
    try:
        while (event := await next_or_end(iterator, watch, idle_timeout_s)) is not None:
            if isinstance(event, GatewayError):
                end.status, end.error = "error", event
                yield error_event(event, sent)
                return
            if end.first_chunk_at is None and not event.startswith(_OPENING):
                end.first_chunk_at = time.monotonic()
            if event.startswith(_COMPLETED):
                completed = await with_report(event, report)
                if aborted():
                    message = "The request was aborted before it finished."
                    end.status, end.error = "error", GatewayError(ErrorKind.ENGINE_ERROR, message)
                    yield error_event(end.error, sent)
                    return
                end.status = "complete"
                yield completed
                return
            yield event
            sent += 1
        message = "The engine ended the stream without finishing the answer."
        end.status, end.error = "error", GatewayError(ErrorKind.ENGINE_ERROR, message)
        yield error_event(end.error, sent)
    finally:
        watch.stop()
        closer = getattr(iterator, "aclose", None)
        if closer is not None:
            await closer()
        await on_end(end)


def relay_for(
    endpoint: str,
    source: AsyncIterator[str],
    *,
    idle_timeout_s: float,
    report: ReportWriter,
    aborted: Callable[[], bool],
    on_end: Callable[[StreamEnd], Awaitable[None]],
) -> AsyncGenerator[str, None]:
    """The relay an endpoint's stream takes: typed events for `/v1/responses`, `data:`
    chunks (`gateway.streaming.relay`) for chat and completions."""
    if endpoint == "responses":
        return relay_events(
            source,
            idle_timeout_s=idle_timeout_s,
            report=report,
            aborted=aborted,
            on_end=on_end,
        )
    return relay(source, idle_timeout_s=idle_timeout_s, report=report, on_end=on_end)
