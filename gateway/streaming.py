"""Relays vLLM's SSE chunks to the client under the nothing-lost contract.

Every stream ends in exactly one terminal state: vLLM's real finish chunk then
`[DONE]`, or one SSE error event (and no `[DONE]`, so no client can take a
truncated answer for a complete one); the backend raises its failures from the
stream (`engine.port`). A stream with no chunk for
`idle_timeout_s` ends with a `stream_stalled` error. Closing this generator
(client disconnect, timeout, error) closes vLLM's generator, which aborts the
engine request. The final usage chunk (`choices: []`), where vLLM writes its
`metrics.speculative_decoding` block, carries the speculation report
(`gateway.speculation_report`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from engine.interface import EngineError
from gateway.clock import MONOTONIC, Clock, Timer
from gateway.errors import ErrorKind, GatewayError, from_engine

_DONE = "data: [DONE]"
_FINISHED = '"finish_reason":"'
_ABORTED = '"finish_reason":"abort"'
_CUT = "The request was aborted before it finished."
_UNFINISHED = "The engine ended the stream without finishing the answer."


@dataclass(slots=True)
class StreamEnd:
    """How a relayed stream ended: `complete`, or the error label, or `disconnected`;
    `first_chunk_at`: when its first answer chunk came (`time.monotonic`, the clock of
    `gateway.request_clock`), None if none came."""

    status: str = "disconnected"
    error: GatewayError | None = None
    first_chunk_at: float | None = None


#: Writes the speculation report into a JSON payload (edited in place and returned).
ReportWriter = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


async def with_report(chunk: str, report: ReportWriter) -> str:
    """The usage chunk (the one with empty choices) with the speculation report."""
    payload = await report(json.loads(chunk[len("data: ") :]))
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class IdleWatch:
    """Bounds each wait for the next chunk with one timer per stream.

    A timeout scope per chunk (`asyncio.timeout`) schedules and cancels a timer
    for every token: on a no-op engine about a tenth of the gateway's CPU. Here a
    wait only stamps its start; the stream's one timer, when it fires, cancels the
    task if the current wait has run past the bound and otherwise re-arms itself at
    that wait's deadline. It cancels only while the task is suspended in the wait
    (never in the middle of a send to the client), and `absorb` tells its own
    cancellation from anyone else's, as `asyncio.timeout` does. The timer runs on
    `clock` (the event loop's by default).
    """

    __slots__ = ("_base", "_clock", "_fired", "_handle", "_since", "_task", "_timeout", "waiting")

    def __init__(self, timeout_s: float, clock: Clock = MONOTONIC) -> None:
        self._clock = clock
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("IdleWatch needs a running task")
        self._task = task
        self._base = task.cancelling()
        self._timeout = timeout_s
        self._fired = False
        self.waiting = False
        self._since = clock.now()
        self._handle: Timer | None = clock.call_later(timeout_s, self._check)

    def wait_starts(self) -> None:
        self._since = self._clock.now()
        self.waiting = True

    def _check(self) -> None:
        now = self._clock.now()
        if self.waiting and now >= self._since + self._timeout:
            self._handle = None
            self._fired = True
            self._task.cancel()
            return
        due = (self._since if self.waiting else now) + self._timeout
        self._handle = self._clock.call_later(due - now, self._check)

    def absorb(self) -> bool:
        """Whether the CancelledError being handled is this watch's (now taken back)."""
        if not self._fired:
            return False
        self._fired = False
        return self._task.uncancel() <= self._base

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def next_or_end(
    iterator: AsyncIterator[str], watch: IdleWatch, idle_timeout_s: float
) -> str | GatewayError | None:
    """The source's next chunk, the error that ends the stream (the backend's, raised in
    its closed set, `engine.port`; or a stall past `idle_timeout_s`), or None at its end."""
    watch.wait_starts()
    try:
        return await anext(iterator)
    except StopAsyncIteration:
        return None
    except EngineError as exc:
        return from_engine(exc)
    except asyncio.CancelledError:
        if not watch.absorb():
            raise
        message = f"No progress for {idle_timeout_s:g} s; the request was aborted."
        return GatewayError(ErrorKind.STREAM_STALLED, message)
    finally:
        watch.waiting = False


async def relay(
    source: AsyncIterator[str],
    *,
    idle_timeout_s: float,
    report: ReportWriter,
    on_end: Callable[[StreamEnd], Awaitable[None]],
    clock: Clock = MONOTONIC,
) -> AsyncGenerator[str, None]:
    end = StreamEnd()
    finished = False
    iterator = aiter(source)
    watch = IdleWatch(idle_timeout_s, clock)
    try:
        while (chunk := await next_or_end(iterator, watch, idle_timeout_s)) is not None:
            if isinstance(chunk, GatewayError):
                end.status, end.error = "error", chunk
                yield chunk.sse_event()
                return
            if end.first_chunk_at is None:
                end.first_chunk_at = time.monotonic()
            if chunk.startswith(_DONE):
                if not finished:
                    break
                end.status = "complete"
                yield chunk
                return
            if _ABORTED in chunk:
                # vLLM ends an aborted request (drain deadline, engine abort) with
                # finish_reason "abort": that is an error, never a finished answer.
                end.status, end.error = "error", GatewayError(ErrorKind.ENGINE_ERROR, _CUT)
                yield end.error.sse_event()
                return
            if _FINISHED in chunk:
                finished = True
            elif '"choices":[]' in chunk and '"usage"' in chunk:
                chunk = await with_report(chunk, report)
            yield chunk
        end.status, end.error = "error", GatewayError(ErrorKind.ENGINE_ERROR, _UNFINISHED)
        yield end.error.sse_event()
    finally:
        watch.stop()
        closer = getattr(iterator, "aclose", None)
        if closer is not None:
            await closer()
        await on_end(end)
