"""The acceptance estimator's forgetting: per request that tried a position, not per request."""

from __future__ import annotations

import pytest

from engine.interface import RequestOutcome, SpeculationOutcome
from gateway.control.estimator import AcceptanceEstimator, EstimatorParams

PARAMS = EstimatorParams(positions=5, alpha=0.1, window=16, prior_strength=4.0, depth_decay=1.0)


def outcome(k: int, steps: int, accept: float) -> RequestOutcome:
    """`steps` verify steps at depth k, each position tried accepted at `accept` (counts
    rounded down), so trials and acceptances are exact per position."""
    tried: list[int] = []
    accepted: list[int] = []
    reach = steps
    for _ in range(k):
        tried.append(reach)
        reach = int(reach * accept)
        accepted.append(reach)
    spec = SpeculationOutcome(
        k=k,
        verify_steps=steps,
        draft_tokens=k * steps,
        accepted_tokens=sum(accepted),
        accepted_per_position=tuple(accepted),
        drafted_per_position=(steps,) * k,
        tried_per_position=tuple(tried),
    )
    return RequestOutcome("r", 10, steps + sum(accepted), "length", spec)


def test_positions_past_a_request_s_depth_keep_their_evidence() -> None:
    """A probe at k = 4 measures positions 3 and 4; requests at k = 2 after it forget
    positions 1 and 2 as they add to them, and leave 3 and 4 as the probe left them."""
    est = AcceptanceEstimator(PARAMS, (0.7,))
    est.observe(outcome(4, 100, 0.9))
    probe_trials = est.live.trials_at[2:4]
    probe_p = est.profile().p[2:4]
    assert all(t > 0 for t in probe_trials)
    for _ in range(40):
        est.observe(outcome(2, 100, 0.9))
    assert est.live.trials_at[2:4] == probe_trials
    # (their prior pseudo-trials lean on position 2, which moved a little)
    assert est.profile().p[2:4] == pytest.approx(probe_p, rel=1e-3)
    # Positions 1 and 2 forget at alpha per request: their window is ~1/alpha requests.
    assert est.live.trials_at[0] == pytest.approx(100 * (1 - (1 - 0.1) ** 41) / 0.1, rel=0.02)
    # A later request that tries position 3 forgets it then.
    est.observe(outcome(3, 100, 0.5))
    assert est.live.trials_at[2] == pytest.approx(probe_trials[0] * 0.9 + 25)  # 100, 50, 25
    assert est.live.trials_at[3] == probe_trials[1]


def test_a_request_at_k0_forgets_nothing() -> None:
    est = AcceptanceEstimator(PARAMS, (0.7,))
    est.observe(outcome(3, 100, 0.8))
    before = list(est.live.trials_at)
    est.observe(outcome(0, 0, 0.0))
    assert est.live.trials_at == before
