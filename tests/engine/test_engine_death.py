"""When the engine core dies, in-flight and new requests fail fast, health says so.

On the package's shared engine, as its last user (tests/engine/conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest

from engine.interface import EngineDeadError, EngineError, GenerateRequest
from engine.vllm.engine import VLLMEngine

pytestmark = [pytest.mark.engine, pytest.mark.asyncio(loop_scope="session")]


#: Kills the package's shared engine: its tests run after every other test on it
#: (tests/engine/conftest.py), which then shuts the dead engine down.
ENDS_SHARED_ENGINE = True


@pytest.fixture(scope="module")
def engine(speculative_engine: VLLMEngine) -> VLLMEngine:
    return speculative_engine


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
