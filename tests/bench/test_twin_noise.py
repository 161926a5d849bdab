"""Step-time noise: lognormal with median 1, seeded, the same for every mode at step i."""

from __future__ import annotations

import itertools
import math
import statistics

import pytest

from bench.twin.costs import StepCosts
from bench.twin.engine import VirtualClock, simulate
from bench.twin.modes.static import Static
from bench.twin.requests import TwinRequest
from bench.twin.schema import Profile

PROFILE = Profile.model_validate(
    {
        "name": "flat",
        "source": "test",
        "max_k": 2,
        "batch_stats": {"1": {"0": 10.0, "2": 14.0}},
        "prefill_ms_per_token": {"target": 0.0, "drafter": 0.0},
    }
)
COSTS = StepCosts.of(PROFILE, 4)


def _requests() -> list[TwinRequest]:
    return [TwinRequest(0, "c", 0, 0, 0, 8, 40, (1.0,) * 16, bytes(40))]


def test_zero_sigma_is_noiseless_and_the_draws_have_the_asked_spread() -> None:
    assert COSTS.with_noise(0.0, 1).noise == (1.0,)
    noisy = COSTS.with_noise(0.1, 1)
    logs = [math.log(x) for x in noisy.noise]
    assert statistics.median(noisy.noise) == pytest.approx(1.0, abs=0.01)
    assert statistics.pstdev(logs) == pytest.approx(0.1, rel=0.05)
    assert noisy.noise == COSTS.with_noise(0.1, 1).noise
    assert noisy.noise != COSTS.with_noise(0.1, 2).noise


def test_each_step_time_is_scaled_by_its_index_jitter() -> None:
    noisy = COSTS.with_noise(0.2, 3)
    exact = simulate(_requests(), Static(0), COSTS, VirtualClock())
    jittered = simulate(_requests(), Static(0), noisy, VirtualClock())
    assert exact.steps == jittered.steps
    # Step 0 prefills (free here), steps 1..39 decode at 10 ms times their multiplier.
    assert jittered.makespan_s == pytest.approx(0.010 * sum(noisy.noise[1 : exact.steps]))
    again = simulate(_requests(), Static(0), noisy, VirtualClock())
    assert again.makespan_s == jittered.makespan_s
    shifted = simulate(_requests(), Static(0), noisy, VirtualClock(), noise_start=7)
    assert shifted.makespan_s == pytest.approx(0.010 * sum(noisy.noise[8 : 7 + exact.steps]))


def test_host_drift_wanders_slowly_with_the_asked_spread_and_leaves_zero_drift_as_it_was() -> None:
    assert COSTS.with_noise(0.1, 1, drift=0.0).noise == COSTS.with_noise(0.1, 1).noise
    drifting = COSTS.with_noise(0.0, 4, drift=0.2)
    logs = [math.log(x) for x in drifting.noise]
    # Neighbours move together (a slow walk), distant steps little.
    steps = [b - a for a, b in itertools.pairwise(logs)]
    assert statistics.pstdev(steps) < 0.01
    assert 0.05 < statistics.pstdev(logs) < 0.4  # about 6 correlation lengths: a rough spread
    assert drifting.noise == COSTS.with_noise(0.0, 4, drift=0.2).noise
    both = COSTS.with_noise(0.1, 4, drift=0.2)
    jitter = COSTS.with_noise(0.1, 4)
    ratio = [b / j / d for b, j, d in zip(both.noise, jitter.noise, drifting.noise, strict=True)]
    assert max(abs(r - 1.0) for r in ratio) < 1e-9  # the jitter times the drift
