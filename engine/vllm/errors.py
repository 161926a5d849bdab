"""vLLM's error replies as the backend's closed error set, translated here once.

vLLM's serving layer answers a refused request with an `ErrorResponse` (its HTTP
status in `error.code`), ends a failing chat or completion stream with one
`data: {"error": {...}}` line (`create_streaming_error_response`), and a failing
Responses stream with an `error` or `response.failed` event. The serving port
raises every one of them as an `EngineError` whose `kind` is an
`engine.interface.ErrorClass`, so the gateway reads no vLLM payload: it maps the
class to its own error kind (`gateway.errors.from_engine`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from engine.interface import EngineError, ErrorClass
from engine.protocol import ErrorResponse
from engine.responses_wire import CLIENT_FAULT, event_sse

#: HTTP statuses vLLM answers with that have a class of their own; any other 4xx is the
#: request's fault, anything else the engine's.
_BY_STATUS = {
    400: ErrorClass.INVALID_REQUEST,
    404: ErrorClass.NOT_FOUND,
    413: ErrorClass.PAYLOAD_TOO_LARGE,
    503: ErrorClass.NOT_READY,
}
_ERROR_LINE = 'data: {"error"'
_FAILED_EVENTS = frozenset({"error", "response.failed"})


def class_of(status: int) -> ErrorClass:
    """The class of an HTTP status vLLM answered with."""
    fallback = ErrorClass.INVALID_REQUEST if 400 <= status < 500 else ErrorClass.ENGINE_ERROR
    return _BY_STATUS.get(status, fallback)


def refused(error: ErrorResponse) -> EngineError:
    """vLLM's `ErrorResponse` (a reply instead of an answer) as an engine error."""
    info = error.error
    return EngineError(info.message, kind=class_of(int(info.code)), param=info.param)


def stream_error(line: str) -> EngineError:
    """vLLM's in-stream error line: a client's fault (4xx) or the engine's."""
    try:
        info = json.loads(line[len("data: ") :])["error"]
        status = int(info.get("code", 500))
        message = str(info.get("message", "engine error"))
    except (ValueError, KeyError, TypeError, AttributeError):
        status, message = 500, "engine error"
    client = 400 <= status < 500
    return EngineError(
        message, kind=ErrorClass.INVALID_REQUEST if client else ErrorClass.ENGINE_ERROR
    )


async def raising(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """vLLM's SSE lines, its in-stream error line raised (`stream_error`) instead."""
    async for line in lines:
        if line.startswith(_ERROR_LINE):
            raise stream_error(line)
        yield line


def failed_event(event: Any) -> EngineError:
    """vLLM's `error` or `response.failed` event as an engine error."""
    failed = getattr(getattr(event, "response", None), "error", None)
    code = getattr(event, "code", None) or getattr(failed, "code", None)
    message = getattr(event, "message", None) or getattr(failed, "message", None)
    kind = ErrorClass.INVALID_REQUEST if code == CLIENT_FAULT else ErrorClass.ENGINE_ERROR
    return EngineError(str(message or "engine error"), kind=kind)


async def framed_events(events: AsyncIterator[Any]) -> AsyncIterator[str]:
    """vLLM's Responses events as SSE text (`engine.responses_wire.event_sse`); a failure
    event or an exception inside vLLM's generator is raised as an engine error.

    vLLM's own route lets an exception inside the generator cut the connection; the
    port raises it instead, so the gateway ends the stream with an event that says why
    (a client fault, such as a prompt over the context, keeps its 4xx class).
    Cancellation is never caught: closing this generator closes vLLM's, which aborts
    the engine request.
    """
    try:
        async for event in events:
            if getattr(event, "type", None) in _FAILED_EVENTS:
                raise failed_event(event)
            yield event_sse(event)
    except EngineError:
        raise
    except Exception as exc:  # whatever failed, the engine's fault
        raise EngineError(str(exc) or type(exc).__name__) from exc


__all__ = [
    "class_of",
    "failed_event",
    "framed_events",
    "raising",
    "refused",
    "stream_error",
]
