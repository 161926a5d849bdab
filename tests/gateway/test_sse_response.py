"""`SSEResponse` as an ASGI app: the whole body when the client stays, the stream stopped
and cleaned up when it leaves, and other cancellations left to propagate."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest
from starlette.types import Message

from gateway.api.responses import SSEResponse
from gateway.replies import StreamReply
from tests.clock import until

SCOPE: dict[str, Any] = {
    "type": "http",
    "asgi": {"version": "3.0", "spec_version": "2.3"},
    "method": "POST",
    "headers": [],
}


class Stream:
    """A stream of `n` chunks (`hang`: then one that never comes), and what became of it."""

    def __init__(self, n: int, hang: bool = False) -> None:
        self.n, self.hang = n, hang
        self.closed = False
        self.finalized = 0

    async def chunks(self) -> AsyncGenerator[str, None]:
        try:
            for i in range(self.n):
                yield f"data: {i}\n\n"
                await asyncio.sleep(0)
            if self.hang:
                await asyncio.Event().wait()
        finally:
            self.closed = True

    async def finalize(self) -> None:
        self.finalized += 1

    def response(self) -> SSEResponse:
        return SSEResponse(StreamReply(self.chunks(), {"x-specgw-k": "0"}, self.finalize))


class Client:
    """The server side of one connection: what was sent, and when the client leaves."""

    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.left = asyncio.Event()

    async def receive(self) -> Message:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)


async def test_a_client_that_stays_gets_every_chunk_then_the_end() -> None:
    stream, client = Stream(5), Client()
    await stream.response()(SCOPE, client.receive, client.send)
    assert client.sent[0]["type"] == "http.response.start"
    assert (b"x-specgw-k", b"0") in client.sent[0]["headers"]
    bodies = [m["body"] for m in client.sent[1:]]
    assert bodies == [f"data: {i}\n\n".encode() for i in range(5)] + [b""]
    assert client.sent[-1]["more_body"] is False
    assert stream.closed
    assert stream.finalized == 1


async def test_a_client_that_leaves_stops_the_stream_without_an_error() -> None:
    stream, client = Stream(2, hang=True), Client()
    task = asyncio.ensure_future(stream.response()(SCOPE, client.receive, client.send))
    await until(lambda: len(client.sent) == 3, what="the start and both chunks sent")
    client.left.set()
    await asyncio.wait_for(task, 5)  # returns: the client's leaving is not an error
    assert not task.cancelled()
    assert stream.closed
    assert stream.finalized == 1
    assert all(m.get("more_body", True) for m in client.sent)  # no end frame was sent


async def test_a_cancellation_not_from_the_client_propagates() -> None:
    stream, client = Stream(1, hang=True), Client()
    task = asyncio.ensure_future(stream.response()(SCOPE, client.receive, client.send))
    await until(lambda: len(client.sent) == 2, what="the start and the chunk sent")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert stream.closed
    assert stream.finalized == 1
