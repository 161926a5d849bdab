"""An unmeasured bucket's relative costs are lent by the measured ones (`cost_shape`)."""

from __future__ import annotations

import pytest

from gateway.control.cost_model import CostModel
from gateway.control.cost_shape import MIN_GROWTH, borrowed_shape, measured_shapes


def _table(ms: tuple[float, ...], n: float = 10.0) -> list[list[float]]:
    return [[n, n * t] for t in ms]


def test_interpolated_between_and_grown_above_the_measured_buckets() -> None:
    shapes = measured_shapes({4: _table((10, 12, 14)), 16: _table((10, 14, 18))})
    assert shapes[4] == pytest.approx([0.0, 0.2, 0.4])
    assert borrowed_shape(shapes, 16, 2) is None  # measured itself
    assert borrowed_shape(shapes, 8, 2) == pytest.approx((1.0, 1.3, 1.6))
    assert borrowed_shape(shapes, 1, 2) == pytest.approx((1.0, 1.2, 1.4))
    # Above 16: the excess grows per doubling as from 4 to 16 (x2 over two doublings:
    # sqrt 2 each), never past k: at 64, k = 1: 0.4 x 2 = 0.8; k = 2: 0.8 x 2 = 1.6.
    assert borrowed_shape(shapes, 64, 2) == pytest.approx((1.0, 1.8, 2.6))
    assert borrowed_shape(shapes, 256, 2) == pytest.approx((1.0, 2.0, 3.0))  # capped at k


def test_a_thin_bucket_is_not_lent_and_a_falling_excess_is_held() -> None:
    shapes = measured_shapes(
        {1: _table((10, 13, 15)), 8: _table((10, 12, 15)), 2: _table((9, 9, 9), n=1)}
    )
    assert set(shapes) == {1, 8}
    # The excess fell from 1 to 8 at k = 1: above 8 it grows at MIN_GROWTH per doubling.
    grown = MIN_GROWTH**3
    assert borrowed_shape(shapes, 64, 2) == pytest.approx((1.0, 1 + 0.2 * grown, 1 + 0.5 * grown))


def test_a_load_bucket_seen_only_at_k0_is_priced_by_the_calibrated_shape() -> None:
    """Calibration at batch 1..16 (a draft costs 20 % of a step at every size), traffic
    at batch 200 (bucket 256) only at k = 0: k = 2 there costs the calibrated excess
    grown at MIN_GROWTH for four doublings, 1 + 0.4 x 1.25^4 = 1.98, not the prior's
    1 + 2 x 0.08 x (1 + 256 / 16) = 3.7."""
    model = CostModel(2, 0.02, 0.08, 16.0, 2.0, 0.01, 0.002)
    for batch in (1, 2, 4, 8, 16):
        for _ in range(20):
            for k in range(3):
                model.observe_step(batch, k, 0.01 * (1 + 0.2 * k))
    for _ in range(200):
        model.observe_step(200, 0, 0.03)
    assert model.relative_costs(200)[2] == pytest.approx(1 + 0.4 * MIN_GROWTH**4, rel=0.05)
