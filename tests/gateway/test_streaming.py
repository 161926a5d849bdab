"""The stream relay's terminal states: finished + [DONE], or exactly one error event."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import pytest

from engine.interface import InvalidRequestError
from gateway.streaming import StreamEnd, relay

CHUNK = 'data: {"choices":[{"index":0,"delta":{"content":"x"},"finish_reason":null}]}\n\n'
FINISH = 'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
USAGE = 'data: {"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2}}\n\n'
DONE = "data: [DONE]\n\n"


async def _source(items: list[str], hang: bool = False) -> AsyncIterator[str]:
    for item in items:
        yield item
    if hang:
        await asyncio.sleep(3600)


def _relay(
    source: AsyncIterator[str], idle_timeout_s: float, ends: list[StreamEnd]
) -> AsyncGenerator[str, None]:
    """`relay` with a fixed speculation report; each stream's end lands in `ends`."""

    async def report(body: dict[str, Any]) -> dict[str, Any]:
        body["speculation"] = {"k": 2}
        return body

    async def on_end(end: StreamEnd) -> None:
        ends.append(end)

    return relay(source, idle_timeout_s=idle_timeout_s, report=report, on_end=on_end)


async def _collect(items: list[str], hang: bool = False) -> tuple[list[str], StreamEnd]:
    ends: list[StreamEnd] = []
    out = [c async for c in _relay(_source(items, hang), 0.1, ends)]
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
    ends: list[StreamEnd] = []
    out = []
    async for chunk in _relay(_source([CHUNK, CHUNK, FINISH, USAGE, DONE]), 0.05, ends):
        out.append(chunk)
        await asyncio.sleep(0.12)  # each send takes over twice the bound
    assert ends[0].status == "complete"
    assert out[-1] == DONE


async def test_a_stall_after_slow_reads_is_still_caught() -> None:
    ends: list[StreamEnd] = []

    async def slow_then_hang() -> AsyncIterator[str]:
        yield CHUNK
        yield CHUNK
        await asyncio.sleep(3600)
        yield FINISH

    out = []
    async with asyncio.timeout(5):
        async for chunk in _relay(slow_then_hang(), 0.05, ends):
            out.append(chunk)
            await asyncio.sleep(0.08)
    assert ends[0].status == "error"
    assert json.loads(out[-1][6:])["error"]["code"] == "stream_stalled"


async def test_cancelling_the_stream_is_not_reported_as_a_stall() -> None:
    """A client that leaves cancels the relay's task: that cancellation propagates."""
    ends: list[StreamEnd] = []

    async def consume() -> list[str]:
        return [c async for c in _relay(_source([CHUNK], hang=True), 30, ends)]

    task = asyncio.ensure_future(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert ends[0].status == "disconnected"
