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

from engine.fake import FakeEngineConfig, StepTimeModel
from tests.clock import until
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


class CountedSteps:
    """The fake engine's step-time model, counting the steps it was asked to time: the
    fake streams each step's tokens before it times the next, so `count >= 3` means the
    first two steps' tokens have been handed on."""

    def __init__(self, model: StepTimeModel | None = None) -> None:
        self.model = model or StepTimeModel()
        self.count = 0

    def __call__(self, k: int, batch: int) -> float:
        self.count += 1
        return self.model(k, batch)

    def engine(self) -> FakeEngineConfig:
        return FakeEngineConfig(step_time=self)


async def when_streaming(steps: CountedSteps, then: Any) -> None:
    """Run `then()` once a request is in the engine and has streamed some tokens."""
    await until(lambda: steps.count >= 3, what="two engine steps streamed")
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


async def test_an_engine_death_mid_stream() -> None:
    steps = CountedSteps()
    async with serve_in_process(engine=steps.engine()) as gw:

        async def kill() -> None:
            gw.engine.kill()

        killer = asyncio.create_task(when_streaming(steps, kill))
        events = await _stream(gw, LONG)
        await killer
        assert _error(events)["type"] == "server_error"
        assert any('"content":" t' in e for e in events)  # tokens came before the error
        assert gw.runtime.admission.running == 0


async def test_a_stalled_stream_is_ended() -> None:
    slow = FakeEngineConfig(step_time=StepTimeModel(base_s=0.5))
    settings = gateway_settings(stream_idle_timeout_s=0.1)
    async with serve_in_process(settings, engine=slow) as gw:
        events = await _stream(gw, {**LONG, "max_tokens": 4})
        error = _error(events)
        assert error["type"] == "timeout_error"
        assert error["code"] == "stream_stalled"

        async def aborted() -> bool:
            return (await gw.engine.health()).running_requests == 0

        await until(aborted, what="the request aborted in the engine")


async def test_the_drain_deadline_aborts_what_still_runs() -> None:
    steps = CountedSteps()
    settings = gateway_settings(drain_timeout_s=0.05)
    async with serve_in_process(settings, engine=steps.engine()) as gw:
        runtime = gw.runtime

        async def drain() -> None:
            runtime.begin_drain()

        drainer = asyncio.create_task(when_streaming(steps, drain))
        events = await _stream(gw, LONG)
        await drainer
        assert _error(events)["type"] == "server_error"
        assert "aborted" in _error(events)["message"]
