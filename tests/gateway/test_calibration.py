"""Start-up calibration feeds the cost model each depth's measured step time.

A small in-process engine stands in for vLLM here (a unit test of the control
plane's arithmetic); the real engine's calibration is checked through the gateway
in `test_openai_api.py::test_step_costs_are_calibrated_before_ready`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from engine.interface import (
    EngineHealth,
    GenerateRequest,
    GenerationChunk,
    RequestOutcome,
    SpeculationOutcome,
)
from gateway.calibration import PROMPT, calibrate
from gateway.control.cost_model import CostModel

#: Step seconds at depth k: the first draft is dear (a drafter pass), later ones cheap.
STEP = (0.010, 0.018, 0.020, 0.022, 0.024)
#: Seconds to the first token at depth k: the drafter's prefill and first drafts.
FIRST = (0.030, 0.070, 0.071, 0.072, 0.073)
#: Seconds per prompt token beyond the calibration prompt's (a cold prefill).
PREFILL = 0.0015
SHORT = len(PROMPT) // 4


class StepClock:
    """Answers every request with an outcome whose steps took STEP[k] seconds each."""

    max_depth = 4
    lossless_sampling = True

    def __init__(self) -> None:
        self.requests: list[GenerateRequest] = []

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        await asyncio.sleep(0)
        steps = request.max_tokens // 2
        prompt_tokens = len(request.prompt or "") // 4
        first = FIRST[request.k] + PREFILL * max(0, prompt_tokens - SHORT)
        outcome = RequestOutcome(
            request.request_id,
            prompt_tokens=prompt_tokens,
            output_tokens=request.max_tokens,
            finish_reason="length",
            speculation=SpeculationOutcome(k=request.k),
            ttft_s=first,
            e2e_s=first + STEP[request.k] * (steps - 1),
            decode_steps=steps,
        )
        yield GenerationChunk(request.request_id, "", (), True, "length", outcome)

    async def abort(self, request_id: str) -> None:
        return None

    async def health(self) -> EngineHealth:
        return EngineHealth(alive=True, ready=True)

    async def reset_prefix_cache(self) -> bool:
        return True

    async def shutdown(self) -> None:
        return None


def test_calibration_measures_every_depth_at_each_batch() -> None:
    engine = StepClock()
    cost = CostModel(4, 0.02, 0.08, 16.0, 2.0, 0.01)
    points = asyncio.run(calibrate(engine, cost, [1, 4], tokens=16, samples=3))
    assert [(p.batch, p.k) for p in points] == [(b, k) for b in (1, 4) for k in range(5)]
    assert all(r.ignore_eos and r.max_tokens == 16 for r in engine.requests[:-2])
    # 3 rounds of 1, then 1 round of 4; then a short and a cold long prompt at k = 0.
    assert len(engine.requests) == 5 * 3 + 5 * 4 + 2
    short, cold = engine.requests[-2:]
    assert (short.k, cold.k) == (0, 0)
    assert len(cold.prompt or "") > 4 * len(short.prompt or "")
    assert cost.prefill_s == pytest.approx(PREFILL)
    for p in points:
        assert p.step_ms == pytest.approx(STEP[p.k] * 1000)
        assert p.ttft_ms == pytest.approx(FIRST[p.k] * 1000)
        assert p.samples == (3 if p.batch == 1 else 4)
    # The first token in steps at k = 0 of the bucket: 3 samples of 10 ms, shrunk towards
    # the line by 2 prior pseudo-samples (11.3 ms), so within 15 %.
    assert cost.first_token(1) == pytest.approx([f / STEP[0] for f in FIRST], rel=0.15)
    assert cost.thin_depths(1, 3) == []
    assert cost.thin_depths(4, 3) == []
    assert cost.thin_depths(2, 3) == [0, 1, 2, 3, 4]  # not calibrated: traffic probes it
    # The relative costs the policy divides by move most of the way from the prior's
    # 8 % per draft to the measurement (each depth's mean is shrunk towards the line).
    truth = STEP[1] / STEP[0]
    prior = CostModel(4, 0.02, 0.08, 16.0, 2.0, 0.01).relative_costs(1)[1]
    calibrated = cost.relative_costs(1)[1]
    assert prior < 1.1
    assert abs(calibrated - truth) < abs(prior - truth) / 2


def test_no_drafter_means_nothing_to_calibrate_but_k0() -> None:
    engine = StepClock()
    engine.max_depth = 0
    cost = CostModel(0, 0.02, 0.08, 16.0, 2.0, 0.01)
    points = asyncio.run(calibrate(engine, cost, [1], tokens=8, samples=1))
    assert [(p.batch, p.k) for p in points] == [(1, 0)]
