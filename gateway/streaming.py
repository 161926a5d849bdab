"""Relays vLLM's SSE chunks to the client under the nothing-lost contract.

Every stream ends in exactly one terminal state: vLLM's real finish chunk then
`[DONE]`, or one SSE error event (and no `[DONE]`, so no client can take a
truncated answer for a complete one). A stream with no chunk for
`idle_timeout_s` ends with a `stream_stalled` error. Closing this generator
(client disconnect, timeout, error) closes vLLM's generator, which aborts the
engine request. The final usage chunk (`choices: []`) gains the `speculation`
object.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.errors import ErrorKind, GatewayError

_DONE = "data: [DONE]"
_ERROR_PREFIX = 'data: {"error"'
_FINISHED = '"finish_reason":"'
_ABORTED = '"finish_reason":"abort"'


@dataclass(slots=True)
class StreamEnd:
    """How a relayed stream ended: `complete`, or the error label, or `disconnected`."""

    status: str = "disconnected"
    error: GatewayError | None = None
    first_chunk_s: float | None = None


def vllm_error(chunk: str) -> GatewayError:
    """Map vLLM's in-stream error event to the gateway's closed error set."""
    try:
        info = json.loads(chunk[len("data: ") :])["error"]
        code = int(info.get("code", 500))
        message = str(info.get("message", "engine error"))
    except (ValueError, KeyError, TypeError):
        code, message = 500, "engine error"
    kind = ErrorKind.INVALID_REQUEST if 400 <= code < 500 else ErrorKind.ENGINE_ERROR
    return GatewayError(kind, message)


def with_speculation(chunk: str, speculation: dict[str, Any] | None) -> str:
    """Add the speculation object to the usage chunk (the one with empty choices)."""
    if speculation is None:
        return chunk
    payload = json.loads(chunk[len("data: ") :])
    payload["speculation"] = speculation
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


async def relay(
    source: AsyncIterator[str],
    *,
    idle_timeout_s: float,
    speculation: Callable[[], Awaitable[dict[str, Any] | None]],
    on_end: Callable[[StreamEnd], Awaitable[None]],
) -> AsyncGenerator[str, None]:
    end = StreamEnd()
    loop = asyncio.get_running_loop()
    started = loop.time()
    finished = False
    iterator = aiter(source)
    try:
        while True:
            try:
                # A timeout scope, not `wait_for`: wait_for wraps every chunk in a new
                # task, which cost more than the rest of the relay on a no-op engine.
                async with asyncio.timeout(idle_timeout_s):
                    chunk = await anext(iterator)
            except StopAsyncIteration:
                break
            except TimeoutError:
                end.status, end.error = (
                    "error",
                    GatewayError(
                        ErrorKind.STREAM_STALLED,
                        f"No progress for {idle_timeout_s:g} s; the request was aborted.",
                    ),
                )
                yield end.error.sse_event()
                return
            if end.first_chunk_s is None:
                end.first_chunk_s = loop.time() - started
            if chunk.startswith(_ERROR_PREFIX):
                end.status, end.error = "error", vllm_error(chunk)
                yield end.error.sse_event()
                return
            if chunk.startswith(_DONE):
                if not finished:
                    break
                end.status = "complete"
                yield chunk
                return
            if _ABORTED in chunk:
                # vLLM ends an aborted request (drain deadline, engine abort) with
                # finish_reason "abort": that is an error, never a finished answer.
                end.status, end.error = (
                    "error",
                    GatewayError(
                        ErrorKind.ENGINE_ERROR, "The request was aborted before it finished."
                    ),
                )
                yield end.error.sse_event()
                return
            if _FINISHED in chunk:
                finished = True
            elif '"choices":[]' in chunk and '"usage"' in chunk:
                chunk = with_speculation(chunk, await speculation())
            yield chunk
        end.status, end.error = (
            "error",
            GatewayError(
                ErrorKind.ENGINE_ERROR, "The engine ended the stream without finishing the answer."
            ),
        )
        yield end.error.sse_event()
    finally:
        closer = getattr(iterator, "aclose", None)
        if closer is not None:
            await closer()
        await on_end(end)
