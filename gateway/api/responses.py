"""Turning service replies and errors into HTTP responses."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel
from starlette.types import Receive, Scope, Send

from gateway.errors import ErrorKind, GatewayError
from gateway.replies import JsonReply, StreamReply

T = TypeVar("T")

_DESCRIPTIONS = {
    400: "Invalid request",
    401: "Missing or invalid API key",
    403: "Key without this scope",
    404: "Unknown model",
    413: "Body too large",
    429: "Overloaded; see retry-after",
    503: "Not ready or draining; see retry-after",
}


class ErrorInfo(BaseModel):
    """OpenAI's error object as `GatewayError.body()` writes it.

    `code` is the gateway's stable label (`invalid_request`, `overloaded`, ...), a
    string as in OpenAI's API; vLLM's own `ErrorResponse` has an integer `code`.
    """

    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    error: ErrorInfo


def error_docs(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI entries for the errors a route can return, all in OpenAI's error shape.

    Every status a route really returns is documented, so schemathesis's
    status-code and schema conformance checks hold.
    """
    return {code: {"description": _DESCRIPTIONS[code], "model": ErrorBody} for code in codes}


def error_response(error: GatewayError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.response_headers())


class SSEResponse(StreamingResponse):
    """A stream whose cleanup runs even if the client left before the first chunk."""

    def __init__(self, reply: StreamReply) -> None:
        super().__init__(reply.chunks, media_type="text/event-stream", headers=reply.headers)
        self._reply = reply

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            if scope["type"] == "http" and _spec_version(scope) < (2, 4):
                await self._stream_until_disconnect(receive, send)
            else:
                await super().__call__(scope, receive, send)
        finally:
            # Starlette stops iterating on a failed send (client gone) without closing
            # the generator; closing it here aborts the engine request now, not at GC.
            await self._reply.chunks.aclose()
            await self._reply.finalize()

    async def _stream_until_disconnect(self, receive: Receive, send: Send) -> None:
        """Starlette's stream for ASGI servers before 2.4 (uvicorn's httptools: 2.3): the
        body, stopped when the client disconnects, on the request's own task.

        Starlette runs the stream in an anyio task group beside a disconnect listener;
        here the listener cancels this task instead, as the group's scope would. The
        group's start, cancel scope and exit were 5% of the gateway's samples while it
        served streamed requests on the no-op engine (`py-spy record` on the gateway
        during `bench/overhead.py`'s latency loop).
        """
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("SSEResponse needs a running task")
        base = task.cancelling()
        gone = False

        async def listen() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            gone = True
            task.cancel()

        listener = asyncio.ensure_future(listen())
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not gone or task.uncancel() > base:
                raise  # someone else's cancellation: not the client's leaving
        finally:
            listener.cancel()


def _spec_version(scope: Scope) -> tuple[int, ...]:
    return tuple(map(int, scope.get("asgi", {}).get("spec_version", "2.0").split(".")))


def reply_response(reply: JsonReply | StreamReply) -> JSONResponse | SSEResponse:
    if isinstance(reply, StreamReply):
        return SSEResponse(reply)
    return JSONResponse(reply.body, headers=reply.headers)


async def unless_disconnected(request: Request, work: Awaitable[T], timeout_s: float) -> T:
    """Run `work`, cancelling it (and so aborting the engine request) if the client leaves."""
    task: asyncio.Task[Any] = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait(
            {task, watcher}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if task in done:
            result: T = task.result()
            return result
        task.cancel()
        task.add_done_callback(_swallow)
        if watcher in done:
            raise GatewayError(ErrorKind.INVALID_REQUEST, "client disconnected")
        raise GatewayError(ErrorKind.STREAM_STALLED, f"no answer within {timeout_s:g} s")
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            task.add_done_callback(_swallow)


def _swallow(task: asyncio.Task[Any]) -> None:
    """Retrieve a cancelled request's result so asyncio does not log it as lost."""
    if not task.cancelled():
        task.exception()
