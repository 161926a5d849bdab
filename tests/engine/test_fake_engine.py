"""FakeEngine passes the engine contract, and simulates what its docstring promises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from engine.fake import AcceptanceScript, FakeEngine, FakeEngineConfig, StepTimeModel
from engine.interface import (
    GATEWAY_ID_ARG,
    SPEC_CAP_ARG,
    EngineDeadError,
    GenerateRequest,
    InvalidRequestError,
)
from engine.step_rule import (
    SPEC_COSTS_ARG,
    SPEC_VOTE_ARG,
    StepCostTable,
    StepVote,
    vote_step_depth,
)
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


async def test_modelled_latency_is_the_steps_time_whatever_the_host_took() -> None:
    step = StepTimeModel(base_s=0.001, per_draft_s=0.0005, per_seq_s=0.0)
    config = FakeEngineConfig(
        scripts=(AcceptanceScript("[easy]", (1.0, 1.0, 1.0, 1.0)),),
        step_time=step,
        modelled_latency=True,
    )
    engine = FakeEngine(config)
    engine.wedge()  # a stall longer than the whole request's modelled time
    running = asyncio.ensure_future(
        collect(engine, GenerateRequest("m", prompt="[easy] x", max_tokens=41, k=4))
    )
    await asyncio.sleep(0.05)
    engine.resume()
    _, outcome = await running
    # The prefill step, then 8 steps of 5 tokens at k = 4.
    assert outcome.ttft_s == pytest.approx(step(0, 1))
    assert outcome.e2e_s == pytest.approx(step(0, 1) + 8 * step(4, 1))
    assert outcome.tpot_s == pytest.approx(8 * step(4, 1) / 40)


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


async def test_a_cap_lowers_the_requests_already_running() -> None:
    """`SPEC_CAP_ARG` as vLLM's scheduler applies it: a newcomer lowers the depth of the
    requests in flight (never its own, never raising one)."""
    engine = FakeEngine(FakeEngineConfig(default_acceptance=(1.0,)))
    deep = engine.generate(GenerateRequest("deep", prompt="p", max_tokens=60, k=4))
    await anext(deep)  # in flight at k = 4
    capping = GenerateRequest("cap", prompt="q", max_tokens=4, k=2, extra={SPEC_CAP_ARG: 0})
    _, newcomer = await collect(engine, capping)
    rest = [chunk async for chunk in deep]
    outcome = rest[-1].outcome
    assert outcome is not None
    assert outcome.speculation.k == 4  # the depth it asked for, as vLLM reports it
    assert outcome.speculation.verify_steps < 60 // 5  # at k = 0 after the cap: no verify
    assert newcomer.speculation.k == 2
    assert newcomer.speculation.verify_steps > 0


async def test_outcomes_resolve_in_the_tap_by_gateway_id() -> None:
    engine = FakeEngine()
    outcome = engine.outcome_tap.expect("gw-1")
    tagged = GenerateRequest("a", prompt="p", max_tokens=5, extra={GATEWAY_ID_ARG: "gw-1"})
    async for chunk in engine.generate(tagged):
        assert outcome.done() == chunk.finished  # resolved just before the last chunk
    resolved = outcome.result()
    assert resolved is not None
    assert resolved.output_tokens == 5
    await collect(engine, GenerateRequest("b", prompt="p", max_tokens=3))  # no gateway id
    assert len(engine.outcome_tap) == 0


async def test_a_request_that_ends_without_an_outcome_resolves_none() -> None:
    """Closed early, refused, or on an engine that died or shut down: each waiting
    outcome is None at once, and the tap keeps no entry."""
    engine = FakeEngine()
    tap = engine.outcome_tap

    def tagged(gid: str, **fields: Any) -> GenerateRequest:
        return GenerateRequest(gid, prompt="p", extra={GATEWAY_ID_ARG: gid}, **fields)

    closed, refused, died, never = (tap.expect(g) for g in ("closed", "refused", "died", "never"))
    stream = engine.generate(tagged("closed", max_tokens=50))
    await anext(stream)
    await stream.aclose()
    assert closed.done()
    assert closed.result() is None
    with pytest.raises(InvalidRequestError):
        await collect(engine, tagged("refused", max_tokens=0))
    assert refused.done()
    assert refused.result() is None
    running = engine.generate(tagged("died", max_tokens=50))
    await anext(running)
    engine.kill()
    with pytest.raises(EngineDeadError):
        await anext(running)
    assert died.done()
    assert died.result() is None
    assert not never.done()  # its request never reached the engine
    await engine.shutdown()
    assert never.done()
    assert never.result() is None
    assert len(tap) == 0


async def test_a_voter_beside_requests_at_zero_weighs_them_as_the_scheduler_does() -> None:
    """The step rule's riders on the fake: a strong voter alone drafts where each draft
    costs half a step; beside three requests running at k = 0 (which would pay the
    deeper step for nothing) the rule gives it 0, as `engine.vllm.step_votes` does."""
    strong = StepVote((0.9, 0.85, 0.8, 0.75))
    mid = StepCostTable((1, 64), ((1.0, 1.5, 2.0, 2.5, 3.0),) * 2, ((), ()))
    assert vote_step_depth([strong], mid, 1, False) > 0
    assert vote_step_depth([strong], mid, 4, False, riders=3) == 0

    def voter(rid: str) -> GenerateRequest:
        extra = {SPEC_VOTE_ARG: strong.to_arg(), SPEC_COSTS_ARG: mid.to_arg()}
        return GenerateRequest(rid, prompt="v", max_tokens=12, k=4, extra=extra)

    engine = FakeEngine(FakeEngineConfig(default_acceptance=(1.0,)))
    try:
        _, alone = await collect(engine, voter("alone"))
        assert alone.speculation.verify_steps > 0
        zeros = [
            engine.generate(GenerateRequest(f"z{i}", prompt="p", max_tokens=200, k=0))
            for i in range(3)
        ]
        for stream in zeros:
            await anext(stream)  # running at k = 0
        _, beside = await collect(engine, voter("beside"))
        assert beside.speculation.verify_steps == 0
        for stream in zeros:
            await stream.aclose()
    finally:
        await engine.shutdown()
