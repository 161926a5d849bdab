"""How streams end when the engine does not finish them: one SSE error event, no `[DONE]`.

The gateway's nothing-lost contract (`gateway.streaming`) on the fake engine: an engine
core that dies mid-stream, a stream that stalls past `stream_idle_timeout_s`, and a
request aborted at the drain deadline each end with exactly one error event, so no
client can take a cut answer for a whole one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from engine.fake import FakeEngine, FakeEngineConfig, StepTimeModel
from tests.unit.conftest import (
    MESSAGES,
    MODEL,
    USER_KEY,
    InProcessGateway,
    gateway_settings,
    serve_in_process,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

LONG = {"model": MODEL, "messages": MESSAGES, "max_tokens": 1500, "stream": True}


async def _when_running(engine: FakeEngine, then: Any) -> None:
    """Run `then()` once a request is in the engine and has made some progress."""
    for _ in range(2500):  # 5 s at most
        if (await engine.health()).running_requests:
            break
        await asyncio.sleep(0.002)
    await asyncio.sleep(0.02)
    await then()


def _events(text: str) -> list[str]:
    return [event for event in text.split("\n\n") if event]


def _error(events: list[str]) -> dict[str, Any]:
    assert "data: [DONE]" not in events
    assert events[-1].startswith('data: {"error"'), events[-3:]
    assert sum(e.startswith('data: {"error"') for e in events) == 1
    error: dict[str, Any] = json.loads(events[-1][len("data: ") :])["error"]
    return error


async def _stream(gw: InProcessGateway, body: dict[str, Any]) -> list[str]:
    response = await gw.http.post("/v1/chat/completions", json=body, headers=gw.auth(USER_KEY))
    assert response.status_code == 200  # the stream had started: the error is in it
    return _events(response.text)


async def test_an_engine_death_mid_stream(gateway: InProcessGateway) -> None:
    engine = gateway.engine

    async def kill() -> None:
        engine.kill()

    killer = asyncio.create_task(_when_running(engine, kill))
    events = await _stream(gateway, LONG)
    await killer
    assert _error(events)["type"] == "server_error"
    assert any('"content":" t' in e for e in events)  # tokens came before the error
    assert gateway.runtime.admission.running == 0


async def test_a_stalled_stream_is_ended(gateway: InProcessGateway) -> None:
    slow = FakeEngineConfig(step_time=StepTimeModel(base_s=0.5))
    settings = gateway_settings(stream_idle_timeout_s=0.1)
    async with serve_in_process(settings, engine=slow) as gw:
        events = await _stream(gw, {**LONG, "max_tokens": 4})
        error = _error(events)
        assert error["type"] == "timeout_error"
        assert error["code"] == "stream_stalled"
        await asyncio.sleep(0.05)
        assert (await gw.engine.health()).running_requests == 0  # aborted in the engine


async def test_the_drain_deadline_aborts_what_still_runs() -> None:
    async with serve_in_process(gateway_settings(drain_timeout_s=0.05)) as gw:
        runtime = gw.runtime

        async def drain() -> None:
            runtime.begin_drain()

        drainer = asyncio.create_task(_when_running(gw.engine, drain))
        events = await _stream(gw, LONG)
        await drainer
        assert _error(events)["type"] == "server_error"
        assert "aborted" in _error(events)["message"]
