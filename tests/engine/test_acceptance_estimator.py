"""vLLM 0.33's online acceptance estimator (`engine.acceptance_estimator`) against a
transcription of its Triton kernels that solves the whole Newton system."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from engine.acceptance_estimator import (
    DAMPING_OBSERVATIONS,
    INIT_BIAS,
    INIT_SLOPE,
    L2,
    REFIT_INTERVAL,
    AcceptanceEstimator,
    ClassEstimators,
)


def test_cold_start_predicts_with_vllms_coefficients() -> None:
    est = AcceptanceEstimator(3)
    assert est.predict([0.0, 2.0, 100.0]) == pytest.approx(
        [1 / (1 + math.exp(0.2)), 1 / (1 + math.exp(-0.8)), 1 / (1 + math.exp(-19.8))]
    )


@pytest.mark.parametrize(
    ("accepted", "admitted", "observed"),
    [
        (0, 3, [1, 0, 0]),  # the first draft rejected: one observation, label 0
        (2, 3, [1, 1, 1]),  # two accepted and the rejected third
        (3, 3, [1, 1, 1]),  # all accepted
        (1, 1, [1, 0, 0]),  # one admitted and accepted: nothing past it
        (0, 0, [0, 0, 0]),  # none admitted
    ],
)
def test_observe_grades_the_accepted_and_the_first_rejected(
    accepted: int, admitted: int, observed: list[int]
) -> None:
    est = AcceptanceEstimator(3)
    est.observe([1.0, 1.0, 1.0], [0.5, 0.5, 0.5], accepted, admitted)
    assert est._n == observed
    # label - p: +0.5 for an accepted draft, -0.5 for the rejected one.
    assert est._g1 == [(0.5 if k < accepted else -0.5) if observed[k] else 0.0 for k in range(3)]


def _kernel_transcription(
    slope: float, bias: np.ndarray, rows: list[tuple[np.ndarray, np.ndarray, int, int]]
) -> tuple[float, np.ndarray]:
    """One refit as `_accumulate_kernel` and `_refit_kernel` do it, the system solved whole."""
    k = len(bias)
    xtwx = np.zeros((k + 1, k + 1))
    xtr = np.zeros(k + 1)
    n = np.zeros(k)
    for features, preds, accepted, admitted in rows:
        for j in range(k):
            if j <= accepted and j < admitted:
                x = np.zeros(k + 1)
                x[0], x[1 + j] = features[j], 1.0
                w = preds[j] * (1 - preds[j])
                xtwx += w * np.outer(x, x)
                xtr += ((1.0 if j < accepted else 0.0) - preds[j]) * x
                n[j] += 1
    delta = np.linalg.solve(xtwx + L2 * np.eye(k + 1), xtr)
    step_w = delta[0] * n.sum() / (n.sum() + DAMPING_OBSERVATIONS)
    if slope + step_w < 0:
        step_w = 0.0
    c = np.diag(xtwx)[1:] + L2
    b = xtwx[0, 1:]
    step_b = (xtr[1:] - b * step_w) / c * n / (n + DAMPING_OBSERVATIONS)
    return slope + step_w, bias + step_b


@pytest.mark.parametrize("true_slope", [1.5, 0.1])
def test_refits_match_the_kernels_transcription(true_slope: float) -> None:
    k = 4
    rng = random.Random(7)
    est = AcceptanceEstimator(k)
    slope, bias = INIT_SLOPE, np.full(k, INIT_BIAS)
    for _refit in range(3):
        rows = []
        for _step in range(REFIT_INTERVAL):
            for _request in range(3):
                features = np.array([rng.gauss(1.0, 2.0) for _ in range(k)])
                preds = np.array(est.predict(list(features)))
                accepted = 0
                while accepted < k and rng.random() < 1 / (
                    1 + math.exp(-(true_slope * features[accepted] - 0.5))
                ):
                    accepted += 1
                admitted = rng.randint(0, k)
                accepted = min(accepted, admitted)
                est.observe(list(features), list(preds), accepted, admitted)
                rows.append((features, preds, accepted, admitted))
            est.end_step()
        slope, bias = _kernel_transcription(slope, bias, rows)
        assert est.slope == pytest.approx(slope, rel=1e-9)
        assert est.intercepts == pytest.approx(list(bias), rel=1e-9)
    assert est.refits == 3
    # The fit moves toward the true slope from the cold start.
    assert (est.slope > INIT_SLOPE) == (true_slope > INIT_SLOPE)


def test_pooled_shares_one_fit_per_class_keeps_its_own() -> None:
    pooled, per_class = ClassEstimators(2, pooled=True), ClassEstimators(2, pooled=False)
    assert pooled.of("a") is pooled.of("b")
    assert per_class.of("a") is not per_class.of("b")
    assert per_class.of("a") is per_class.of("a")
