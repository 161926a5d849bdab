"""When the engine core dies, in-flight and new requests fail fast, health says so."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from engine.interface import EngineDeadError, EngineError, GenerateRequest
from engine.vllm.engine import VLLMEngine
from tests.engine.engines import engine_settings

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def engine() -> AsyncIterator[VLLMEngine]:
    settings = engine_settings(max_depth=2).model_copy(update={"warmup_prompts": 0})
    async with VLLMEngine.started(settings) as started:
        yield started


async def test_engine_core_death_errors_every_request(engine: VLLMEngine) -> None:
    streams = [
        engine.generate(GenerateRequest(f"dying-{i}", prompt="tick tock", max_tokens=5000, k=i))
        for i in range(3)
    ]
    for stream in streams:
        await anext(stream)
    pids = engine.engine_core_pids()
    assert pids
    for pid in pids:
        os.kill(pid, signal.SIGKILL)

    async def drain(stream: AsyncIterator[object]) -> BaseException | None:
        try:
            async for _ in stream:
                pass
        except EngineError as exc:
            return exc
        return None

    errors = await asyncio.wait_for(asyncio.gather(*(drain(s) for s in streams)), timeout=30)
    assert all(isinstance(e, EngineDeadError) for e in errors), errors
    health = await engine.health()
    assert not health.alive
    assert not health.ready
    with pytest.raises(EngineError):
        await asyncio.wait_for(
            anext(engine.generate(GenerateRequest("after", prompt="x", max_tokens=4))), 10
        )
