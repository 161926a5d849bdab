"""FakeEngine passes the engine contract, and simulates what its docstring promises."""

from __future__ import annotations

import pytest

from engine.fake import AcceptanceScript, FakeEngine, FakeEngineConfig
from engine.interface import EngineDeadError, GenerateRequest
from tests.engine.contract import CONTRACT, collect


@pytest.mark.parametrize("check", sorted(CONTRACT))
async def test_contract(check: str) -> None:
    engine = FakeEngine()
    try:
        await CONTRACT[check](engine)
    finally:
        await engine.shutdown()


async def test_acceptance_script_shapes_acceptance() -> None:
    engine = FakeEngine(
        FakeEngineConfig(
            scripts=(
                AcceptanceScript("[easy]", (1.0, 1.0, 1.0, 1.0)),
                AcceptanceScript("[hard]", (0.0,)),
            )
        )
    )
    _, easy = await collect(engine, GenerateRequest("e", prompt="[easy] x", max_tokens=41, k=4))
    _, hard = await collect(engine, GenerateRequest("h", prompt="[hard] x", max_tokens=41, k=4))
    # Prefill gives 1 token, then every step accepts all 4 drafts: 8 steps of 5 tokens.
    assert easy.speculation.verify_steps == 8
    assert easy.speculation.acceptance_length == 5.0
    assert hard.speculation.accepted_tokens == 0
    assert hard.speculation.acceptance_length == 1.0


async def test_kill_fails_in_flight_requests() -> None:
    engine = FakeEngine()
    stream = engine.generate(GenerateRequest("x", prompt="p", max_tokens=1000, k=2))
    await anext(stream)
    engine.kill()
    with pytest.raises(EngineDeadError):
        await anext(stream)
    assert not (await engine.health()).alive
    with pytest.raises(EngineDeadError):
        await anext(engine.generate(GenerateRequest("y", prompt="p", max_tokens=4)))
