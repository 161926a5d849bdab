"""Slow and hostile clients over a real socket: the gateway (fake backend) served by its own
uvicorn config (`gateway.server.server_config`) on a loopback port, driven with raw sockets.

Bounds under test (`gateway.connections`, `gateway.app.RequestEdge`): the header deadline,
the body deadline, the header size (431) and the open-connection bound. Deadlines are two
seconds here so that the whole module runs in about ten.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from prometheus_client.parser import text_string_to_metric_families

from engine.settings import EngineSettings
from gateway.app import create_app
from gateway.connections import EdgeStats
from gateway.runtime import runtime_factory
from gateway.server import DrainingServer, server_config
from tests.clock import until
from tests.unit.conftest import MESSAGES, MODEL, QUICK_START, USER_KEY, gateway_settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

DEADLINE_S = 2.0
#: How late past its deadline a connection may end as seen by the client: 2,000 closes land in
#: one burst that one event loop reads on 2 shared cores, beside the unit tier's other worker
#: and CI's background install (5.0 s seen at load average 9). Without the deadline they
#: stay open for ever, so any finite bound tells the two apart.
SLACK_S = 4.0
CHAT = json.dumps({"model": MODEL, "messages": MESSAGES, "max_tokens": 4}).encode()
PARTIAL_HEADERS = b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nx-slow: "


@dataclass
class Served:
    app: FastAPI
    port: int

    @property
    def stats(self) -> EdgeStats:
        stats: EdgeStats = self.app.state.edge_stats
        return stats

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{self.port}",
            headers={"authorization": f"Bearer {USER_KEY}", "content-type": "application/json"},
            timeout=10,
        )


@asynccontextmanager
async def serve(**overrides: Any) -> AsyncIterator[Served]:
    settings = gateway_settings(
        port=0, header_timeout_s=DEADLINE_S, body_timeout_s=DEADLINE_S, **overrides
    )
    app = create_app(settings, runtime_factory(EngineSettings(backend="fake"), QUICK_START))
    server = DrainingServer(server_config(app, settings), app)
    task = asyncio.create_task(server.serve())
    # Start-up takes milliseconds on the fake backend: bound, then the engine up.
    await until(lambda: server.started and app.state.runtime is not None, 10.0, "start-up")
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield Served(app, port)
    finally:
        server.should_exit = True
        await task


@pytest_asyncio.fixture(loop_scope="session")
async def served() -> AsyncIterator[Served]:
    async with serve() as started:
        yield started


async def _until_closed(reader: asyncio.StreamReader) -> tuple[bytes, float]:
    """Everything the server sends until it closes, and when it closed."""
    data = await asyncio.wait_for(reader.read(), timeout=DEADLINE_S + SLACK_S + 5)
    return data, time.monotonic()


def _status(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response else 0


def _samples(exposition: str) -> dict[tuple[str, str], float]:
    """The edge's samples in a `/metrics` body, keyed by (name, reason)."""
    return {
        (sample.name, sample.labels.get("reason", "")): sample.value
        for family in text_string_to_metric_families(exposition)
        if family.name.startswith(("specgw_edge", "specgw_open_connections"))
        for sample in family.samples
    }


def _error(response: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]
    return body


async def test_slow_connections_end_at_their_deadline_while_others_are_served(
    served: Served,
) -> None:
    """1,000 connections stall in their headers, 1,000 in their body (content-length 4096,
    100 bytes sent): each ends with 408 at its deadline; a normal chat request sent
    meanwhile is answered while they still wait."""
    body_head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
        b"content-type: application/json\r\ncontent-length: 4096\r\n\r\n"
    )
    connections, opened, watchers = [], [], []
    for i in range(2000):
        # Before the connect: the server's clock starts at its accept, after this, however
        # many loop turns pass between that accept and this task's resumption.
        opened.append(time.monotonic())
        reader, writer = await served.connect()
        # Each sends its stalled bytes at once (opening 2,000 can outlast the deadline on a
        # loaded host, and one that sent nothing by then is closed without an answer: the
        # idle case below) and is watched from then on, so a close is seen when it happens.
        writer.write(PARTIAL_HEADERS if i % 2 == 0 else body_head + b"{" * 100)
        await writer.drain()
        watchers.append(asyncio.create_task(_until_closed(reader)))
        connections.append((reader, writer))
    async with served.http() as http:
        reply = await http.post("/v1/chat/completions", content=CHAT)
        answered_at = time.monotonic()
    assert reply.status_code == 200
    ends = await asyncio.gather(*watchers)
    # Served while the stalled connections still wait, not behind them: before the last
    # one opened reaches its deadline (on a loaded host the 2,000 opens alone can take
    # longer than a deadline, so a bound in seconds from the request's send tells less).
    assert answered_at < ends[-1][1]
    for i, (response, closed_at) in enumerate(ends):
        assert _status(response) == 408, response[:200]
        assert _error(response)["code"] == "request_timeout"
        # No connection can end before its deadline, and none may end long after it.
        assert DEADLINE_S <= closed_at - opened[i] < DEADLINE_S + SLACK_S
        if i % 2 == 1:  # the body's 408 comes from the app: it carries the request id
            assert b"x-request-id" in response.lower()
    assert served.stats.header_timeouts >= 1000
    assert served.stats.body_timeouts >= 1000
    async with served.http() as http:
        exported = _samples((await http.get("/metrics")).text)
    assert exported["specgw_edge_closed_total", "header_timeout"] == served.stats.header_timeouts
    assert exported["specgw_edge_closed_total", "body_timeout"] == served.stats.body_timeouts
    assert exported["specgw_open_connections", ""] >= 1  # the scrape's own connection
    for _, writer in connections:
        writer.close()


async def test_an_idle_connection_is_closed_without_an_answer(served: Served) -> None:
    reader, writer = await served.connect()
    opened = time.monotonic()
    response, closed_at = await _until_closed(reader)
    assert response == b""
    assert closed_at - opened < DEADLINE_S + SLACK_S
    writer.close()


async def test_the_header_deadline_restarts_after_each_response(served: Served) -> None:
    """A kept-alive connection that starts a second request and stalls is ended too."""
    reader, writer = await served.connect()
    writer.write(b"GET /health HTTP/1.1\r\nhost: gw\r\n\r\n")
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(
        next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[
            1
        ]
    )
    await reader.readexactly(length)
    assert _status(head) == 200
    writer.write(b"GET /health HTTP/1.1\r\nhost: g")
    await writer.drain()
    response, _ = await _until_closed(reader)
    assert _status(response) == 408
    writer.close()


async def test_oversized_headers_get_431(served: Served) -> None:
    """A 64 KB and a 200 KB header: 431 in OpenAI's shape; 15 KB of headers pass."""
    for size in (64 * 1024, 200 * 1024):
        reader, writer = await served.connect()
        writer.write(b"GET /health HTTP/1.1\r\nhost: gw\r\nx-big: " + b"a" * size + b"\r\n\r\n")
        await writer.drain()
        response, _ = await _until_closed(reader)
        assert _status(response) == 431, size
        assert _error(response)["code"] == "headers_too_large"
        writer.close()
    async with served.http() as http:
        reply = await http.get("/health", headers={"x-fits": "a" * 15_000})
        exported = _samples((await http.get("/metrics")).text)
    assert reply.status_code == 200
    assert served.stats.headers_too_large >= 2
    assert exported["specgw_edge_closed_total", "header_too_large"] >= 2


async def test_a_header_sent_byte_by_byte_is_cut_at_the_size_limit(served: Served) -> None:
    """A header that never ends is refused once it passes the limit, not at the deadline."""
    reader, writer = await served.connect()
    writer.write(PARTIAL_HEADERS)
    for _ in range(20):
        writer.write(b"b" * 1024)
        await writer.drain()
    response, _ = await _until_closed(reader)
    assert _status(response) == 431
    writer.close()


async def _until_open(served: Served, count: int) -> None:
    """Until the server has accepted exactly `count` connections: a client's connect returns
    at the kernel's handshake, before the server's loop turns that accept it."""
    await until(
        lambda: served.stats.open_connections == count,
        DEADLINE_S + SLACK_S,
        f"{count} connections open",
    )


async def test_connections_beyond_the_bound_are_refused_at_once() -> None:
    async with serve(max_connections=5) as small:
        held = [await small.connect() for _ in range(5)]
        await _until_open(small, 5)
        reader, writer = await small.connect()
        started = time.monotonic()
        response, closed_at = await _until_closed(reader)
        assert _status(response) == 503
        # At its accept, not at the header deadline (a held connection's end): how soon
        # within that is the scheduler's, on a loaded host.
        assert closed_at - started < DEADLINE_S - 0.1
        assert b"retry-after: 1" in response
        assert small.stats.connections_refused == 1
        assert small.stats.open_connections == 6  # the refused one lingers until closed
        writer.close()
        for _, w in held:
            w.close()
        await _until_open(small, 0)
        async with small.http() as http:
            assert (await http.get("/health")).status_code == 200
            exported = _samples((await http.get("/metrics")).text)
        assert exported["specgw_edge_closed_total", "connection_limit"] == 1
        assert exported["specgw_open_connections", ""] == 1  # the scrape's own


async def test_a_body_still_arriving_after_an_early_answer_is_not_a_header(
    served: Served,
) -> None:
    """413 on the declared length; the body the client goes on sending is not counted
    against the header limit (no 431), and the connection ends at the deadline."""
    before = served.stats.headers_too_large
    reader, writer = await served.connect()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n"
        b"content-type: application/json\r\ncontent-length: 5000000\r\n\r\n"
    )
    writer.write(head)
    await writer.drain()
    answer = await reader.readuntil(b"\r\n\r\n")
    assert _status(answer) == 413
    for _ in range(50):
        writer.write(b"x" * 2048)
    await writer.drain()
    await _until_closed(reader)
    assert served.stats.headers_too_large == before
    writer.close()
