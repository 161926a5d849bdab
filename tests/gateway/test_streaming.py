"""The stream relay's terminal states: finished + [DONE], or exactly one error event.

The idle bound runs on a `ManualClock`: a stall is the clock moving past the bound while
the relay waits for the source, a slow reader the clock moving while it waits for the
client.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest

from engine.interface import InvalidRequestError
from gateway.clock import ManualClock, sleep
from gateway.streaming import StreamEnd, relay

CHUNK = 'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
FINISH = 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = 'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
DONE = "data: [DONE]\n\n"


async def _source(items: list[str], hang: bool = False) -> AsyncIterator[str]:
    for item in items:
        yield item
    if hang:
        await asyncio.Event().wait()


def _relay(
    source: AsyncIterator[str],
    idle_timeout_s: float,
    ends: list[StreamEnd],
    clock: ManualClock | None = None,
) -> AsyncGenerator[str, None]:
    """`relay` with a fixed speculation report; each stream's end lands in `ends`."""

    async def report(body: dict[str, Any]) -> dict[str, Any]:
        body["speculation"] = {"k": 2}
        return body

    async def on_end(end: StreamEnd) -> None:
        ends.append(end)

    return relay(
        source,
        idle_timeout_s=idle_timeout_s,
        report=report,
        on_end=on_end,
        clock=clock or ManualClock(),
    )


async def _collect(items: list[str], hang: bool = False) -> tuple[list[str], StreamEnd]:
    """The relayed stream, the clock moved on by its idle bound (10 s) once."""
    clock = ManualClock()
    ends: list[StreamEnd] = []

    async def read_all() -> list[str]:
        return [c async for c in _relay(_source(items, hang), 10.0, ends, clock)]

    reader = asyncio.ensure_future(read_all())
    await clock.advance(9.99)
    assert reader.done() is not hang  # a hanging source ends only at the bound
    await clock.advance(0.01)
    assert reader.done()
    out = reader.result()
    assert len(ends) == 1
    return out, ends[0]


async def test_complete_stream_gets_speculation_and_done() -> None:
    out, end = await _collect([CHUNK, FINISH, USAGE, DONE])
    assert end.status == "complete"
    assert out[-1] == DONE
    assert json.loads(out[-2][6:])["speculation"] == {"k": 2}


async def test_stream_cut_before_finish_is_an_error_not_done() -> None:
    out, end = await _collect([CHUNK, DONE])
    assert end.status == "error"
    assert DONE not in out
    assert json.loads(out[-1][6:])["error"]["code"] == "engine_error"


async def test_stalled_stream_ends_with_error() -> None:
    out, end = await _collect([CHUNK], hang=True)
    assert end.status == "error"
    assert json.loads(out[-1][6:])["error"]["code"] == "stream_stalled"


async def test_an_engine_error_raised_mid_stream_is_relayed_once_without_done() -> None:
    async def failing() -> AsyncIterator[str]:
        yield CHUNK
        raise InvalidRequestError("boom", "prompt")
        yield DONE  # never reached: the relay must not send it

    ends: list[StreamEnd] = []
    out = [c async for c in _relay(failing(), 0.1, ends)]
    assert ends[0].status == "error"
    assert out[-1].startswith('data: {"error"')
    error = json.loads(out[-1][6:])["error"]
    expected = ("invalid_request", "boom", "prompt")
    assert (error["code"], error["message"], error["param"]) == expected
    assert DONE not in out


async def test_a_slow_reader_is_not_a_stalled_engine() -> None:
    """The idle bound covers waits for the engine, not the time the client takes to read."""
    clock = ManualClock()
    ends: list[StreamEnd] = []
    stream = _relay(_source([CHUNK, CHUNK, FINISH, USAGE, DONE]), 10.0, ends, clock)
    out = []
    async for chunk in stream:
        out.append(chunk)
        await clock.advance(25.0)  # each read takes over twice the bound
    assert ends[0].status == "complete"
    assert out[-1] == DONE


async def test_a_stall_after_slow_reads_is_still_caught() -> None:
    clock = ManualClock()
    ends: list[StreamEnd] = []
    out: list[str] = []

    async def read_slowly() -> None:
        async for chunk in _relay(_source([CHUNK, CHUNK], hang=True), 10.0, ends, clock):
            out.append(chunk)
            await sleep(clock, 16.0)  # the client takes 16 s per read

    reader = asyncio.ensure_future(read_slowly())
    await clock.advance(2 * 16.0 + 9.99)  # two slow reads, then 9.99 s waiting on the source
    assert out == [CHUNK, CHUNK]
    await clock.advance(0.01)
    assert json.loads(out[-1][6:])["error"]["code"] == "stream_stalled"
    await clock.advance(16.0)  # the client reads the error; the stream is over
    assert reader.done()
    assert ends[0].status == "error"


async def test_cancelling_the_stream_is_not_reported_as_a_stall() -> None:
    """A client that leaves cancels the relay's task: that cancellation propagates."""
    clock = ManualClock()
    ends: list[StreamEnd] = []

    async def consume() -> list[str]:
        return [c async for c in _relay(_source([CHUNK], hang=True), 30, ends, clock)]

    task = asyncio.ensure_future(consume())
    await clock.advance(29.0)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ends[0].status == "disconnected"
