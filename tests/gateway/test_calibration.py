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
    EngineStep,
    GenerateRequest,
    GenerationChunk,
    RequestOutcome,
    SpeculationOutcome,
    StepListener,
)
from gateway.calibration import (
    PER_REQUEST_BATCHES,
    PREFILL_PAIRS,
    PROMPT,
    calibrate,
    calibration_batches,
)
from gateway.control.cost_model import CostModel
from tests.control.test_cost_model import thin_depths

#: Step seconds at depth k: the first draft is dear (a drafter pass), later ones cheap.
STEP = (0.010, 0.018, 0.020, 0.022, 0.024)
#: Seconds to the first token at depth k: the drafter's prefill and first drafts.
FIRST = (0.030, 0.070, 0.071, 0.072, 0.073)
#: Step seconds at depth k by the engine's clock (`Engine.on_step`), where it has one:
#: below the request means, the more so the deeper (their edges grow with k).
CLOCK = (0.009, 0.015, 0.016, 0.017, 0.018)
#: Seconds per prompt token beyond the calibration prompt's (a cold prefill).
PREFILL = 0.0015
SHORT = len(PROMPT) // 4


class StepClock:
    """Answers every request with an outcome whose steps took STEP[k] seconds each.

    `drift`: every request's times grow by this share of STEP per request sent before
    it (a host slowing down); `cold`: the first request at each depth takes this many
    times as long (one-off start-up costs). `clocked`: it also times its steps, as the
    real engine does: each batch of concurrent requests sends one prefill step, its
    decode steps of CLOCK[k] seconds, and one step with a request fewer (one left).
    """

    max_depth = 4
    lossless_sampling = True

    def __init__(self, drift: float = 0.0, cold: float = 1.0, clocked: bool = False) -> None:
        self.requests: list[GenerateRequest] = []
        self.drift, self.cold, self.clocked = drift, cold, clocked
        self.listener: StepListener | None = None
        self._active = 0
        self._sent = False

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        slower = 1.0 + self.drift * len(self.requests)
        if all(r.k != request.k for r in self.requests):
            slower *= self.cold
        self.requests.append(request)
        self._active += 1
        await asyncio.sleep(0)  # the batch's other requests enter meanwhile
        steps = request.max_tokens // 2
        if self.clocked and self.listener is not None and not self._sent:
            self._sent = True
            b, k = self._active, request.k
            self.listener(EngineStep(0.05, 0, 0, b, 20 * b))
            for _ in range(steps - 1):
                self.listener(EngineStep(CLOCK[k], b, b * (1 + k)))
            if b > 1:
                self.listener(EngineStep(0.5, b - 1, (b - 1) * (1 + k)))
        self._active -= 1
        if self._active == 0:
            self._sent = False
        prompt_tokens = len(request.prompt or "") // 4
        first = (FIRST[request.k] + PREFILL * max(0, prompt_tokens - SHORT)) * slower
        outcome = RequestOutcome(
            request.request_id,
            prompt_tokens=prompt_tokens,
            output_tokens=request.max_tokens,
            finish_reason="length",
            speculation=SpeculationOutcome(k=request.k),
            ttft_s=first,
            e2e_s=first + STEP[request.k] * slower * (steps - 1),
            decode_steps=steps,
        )
        yield GenerationChunk(request.request_id, "", (), True, "length", outcome)

    async def abort(self, request_id: str) -> None:
        return None

    async def health(self) -> EngineHealth:
        return EngineHealth(alive=True, ready=True)

    async def reset_prefix_cache(self) -> bool:
        return True

    def on_step(self, listener: StepListener | None) -> None:
        self.listener = listener

    async def shutdown(self) -> None:
        return None


def test_calibration_measures_every_depth_at_each_batch() -> None:
    engine = StepClock()
    cost = CostModel(4, 0.02, 0.08, 16.0, 2.0, 0.01)
    points = asyncio.run(calibrate(engine, cost, [1, 4], tokens=16, samples=3))
    assert [(p.batch, p.k) for p in points] == [(b, k) for b in (1, 4) for k in range(5)]
    pairs = 2 * PREFILL_PAIRS
    assert all(r.ignore_eos and r.max_tokens == 16 for r in engine.requests[:-pairs])
    # Untimed: one request per depth, one round of 4 at k = 4. Timed: 4 rounds of 1 (3
    # rounded up to even), 2 rounds of 4; then pairs of a short and a cold long prompt
    # at k = 0.
    warm = 5 + 4
    assert len(engine.requests) == warm + 5 * 4 + 5 * 2 * 4 + pairs
    assert [r.k for r in engine.requests[:warm]] == [0, 1, 2, 3, 4, 4, 4, 4, 4]
    # Timed rounds alternate the order of depths: 0..4, then 4..0.
    timed = engine.requests[warm : warm + 20]
    assert [r.k for r in timed] == [0, 1, 2, 3, 4, 4, 3, 2, 1, 0] * 2
    prefill = engine.requests[-pairs:]
    for short, cold in zip(prefill[::2], prefill[1::2], strict=True):
        assert (short.k, cold.k) == (0, 0)
        assert len(cold.prompt or "") > 4 * len(short.prompt or "")
    assert cost.prefill_s == pytest.approx(PREFILL)
    for p in points:
        assert p.step_ms == pytest.approx(STEP[p.k] * 1000)
        assert p.ttft_ms == pytest.approx(FIRST[p.k] * 1000)
        assert p.samples == (4 if p.batch == 1 else 8)
    # The first token in steps at k = 0 of the bucket: 4 samples of 10 ms, shrunk towards
    # the line by 2 prior pseudo-samples, so within 15 %.
    assert cost.first_token(1) == pytest.approx([f / STEP[0] for f in FIRST], rel=0.15)
    assert thin_depths(cost, 1, 3) == []
    assert thin_depths(cost, 4, 3) == []
    assert thin_depths(cost, 2, 3) == [0, 1, 2, 3, 4]  # not calibrated: traffic probes it
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


def test_a_host_that_slows_during_calibration_biases_no_depth() -> None:
    """Each depth's timed rounds sit at the same mean time, so a steady drift scales every
    depth's measured step alike and the relative costs stay true (measured one depth
    after the other, k = 4 came out 1 % dearer per request of drift than k = 0)."""
    engine = StepClock(drift=0.01)
    cost = CostModel(4, 0.02, 0.08, 16.0, 2.0, 0.01)
    points = asyncio.run(calibrate(engine, cost, [4], tokens=16, samples=3))
    at = {p.k: p.step_ms for p in points}
    for k in range(1, 5):
        assert at[k] / at[0] == pytest.approx(STEP[k] / STEP[0], rel=0.01)


def test_one_off_costs_of_the_first_requests_are_not_measured() -> None:
    """The first request at each depth is three times as slow: the warm-up takes it."""
    engine = StepClock(cold=3.0)
    cost = CostModel(4, 0.02, 0.08, 16.0, 2.0, 0.01)
    points = asyncio.run(calibrate(engine, cost, [1], tokens=16, samples=3))
    for p in points:
        assert p.step_ms == pytest.approx(STEP[p.k] * 1000)
        assert p.ttft_ms == pytest.approx(FIRST[p.k] * 1000)


def test_an_engine_that_times_its_steps_is_calibrated_by_them() -> None:
    """Where the engine times its steps, the cost model gets those (as traffic's steps
    are filed), not the requests' mean steps: one measure for every depth. Steps that
    prefilled or did not decode the whole round are not filed."""
    engine = StepClock(clocked=True)
    cost = CostModel(4, 0.02, 0.08, 16.0, 2.0, 0.01)
    points = asyncio.run(calibrate(engine, cost, [1, 4], tokens=16, samples=3))
    assert engine.listener is None  # handed back: the gateway subscribes after calibration
    for p in points:
        assert p.timed_by == "steps"
        assert p.step_ms == pytest.approx(CLOCK[p.k] * 1000)
        # 7 decode steps a round (16 tokens / 2 - 1): 4 rounds at batch 1, 2 at batch 4.
        assert p.samples == 7 * (4 if p.batch == 1 else 2)
        assert p.ttft_ms == pytest.approx(FIRST[p.k] * 1000)
    for batch in (1, 4):
        relative = cost.relative_costs(batch)
        for k in range(1, 5):
            # Shrunk towards the line by 2 pseudo-samples of 14 to 28: within 5 % of
            # the clock's ratios, far from the request means' (STEP).
            assert relative[k] == pytest.approx(CLOCK[k] / CLOCK[0], rel=0.05)
            assert abs(relative[k] - STEP[k] / STEP[0]) > 0.1
    assert thin_depths(cost, 1, 3) == []  # each request still counts as a run at its k
    assert thin_depths(cost, 4, 3) == []


def test_an_engine_without_a_step_clock_is_calibrated_by_request_means() -> None:
    engine = StepClock()
    cost = CostModel(4, 0.02, 0.08, 16.0, 2.0, 0.01)
    points = asyncio.run(calibrate(engine, cost, [1], tokens=16, samples=3))
    assert {p.timed_by for p in points} == {"requests"}
    assert [p.samples for p in points] == [4] * 5


@pytest.mark.parametrize(
    ("configured", "one_depth_per_step", "max_running", "want"),
    [
        ([3, 5], True, 64, [3, 5]),  # configured: as given, on any engine
        ([], True, 64, []),  # off
        (None, False, 64, list(PER_REQUEST_BATCHES)),  # each request its own depth (CPU)
        (None, True, 64, [1, 2, 4, 8, 16, 32, 64]),  # one depth per step (CUDA)
        (None, True, 48, [1, 2, 4, 8, 16, 32, 48]),  # the largest batch itself
        (None, True, 1, [1]),
        (None, True, 4096, [1, 2, 4, 8, 16, 32, 64, 128, 256]),  # the settings' bound
    ],
)
def test_unset_calibration_batches_follow_the_engine(
    configured: list[int] | None, one_depth_per_step: bool, max_running: int, want: list[int]
) -> None:
    assert calibration_batches(configured, one_depth_per_step, max_running) == want
