"""An unmeasured bucket's relative costs are lent by the measured ones (`cost_shape`)."""

from __future__ import annotations

import pytest

from gateway.control.cost_model import CostModel
from gateway.control.cost_shape import MIN_GROWTH, borrowed_shape, fitted_shape, measured_shapes


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


def test_an_extrapolated_bucket_rescales_its_shape_to_the_depths_its_traffic_ran() -> None:
    """Calibrated at batch 1..16 with a flat excess (a draft costs 23 % of a step at every
    size, as an MLA target's); MIN_GROWTH lends batch 64 1 + 0.23 x 1.25^2 = 1.36 per
    draft. Traffic at batch 64 runs k = 1 and k = 2 at the true, still flat, excess:
    their two means fix the scale, so k = 1..3 read 1.23 / 1.46 / 1.69 (k = 0 never ran)."""
    model = CostModel(3, 0.02, 0.08, 16.0, 2.0, 0.01, 0.002)
    for batch in (1, 2, 4, 8, 16):
        for _ in range(20):
            for k in range(4):
                model.observe_step(batch, k, 0.01 * (1 + 0.23 * k))
    assert model.relative_costs(64)[1] == pytest.approx(1 + 0.23 * MIN_GROWTH**2, rel=0.01)
    for _ in range(100):
        for k in (1, 2):
            model.observe_step(64, k, 0.03 * (1 + 0.23 * k))
    assert model.relative_costs(64) == pytest.approx((1.0, 1.23, 1.46, 1.69), rel=0.01)


def test_the_rescaled_excess_stays_between_flat_and_compute_bound() -> None:
    shapes = measured_shapes({8: _table((10, 12, 14)), 16: _table((10, 12, 14))})
    lent = borrowed_shape(shapes, 64, 2)
    assert lent == pytest.approx((1.0, 1 + 0.2 * MIN_GROWTH**2, 1 + 0.4 * MIN_GROWTH**2))
    # Means that say drafting got cheaper than at 16: held at 16's excess (flat).
    cheap = [[0.0, 0.0], [50.0, 50 * 10.5], [50.0, 50 * 11.0]]
    assert fitted_shape(shapes, 64, 2, cheap) == pytest.approx((1.0, 1.2, 1.4))
    # Means that say k = 1 costs three steps: held at the compute bound (k + 1 steps).
    dear = [[0.0, 0.0], [50.0, 50 * 30.0], [50.0, 50 * 50.0]]
    assert fitted_shape(shapes, 64, 2, dear) == pytest.approx((1.0, 1.8, 2.6))
    # One depth, or too few samples: the lent shape as it is.
    assert fitted_shape(shapes, 64, 2, [[0.0, 0.0], [50.0, 600.0], [0.0, 0.0]]) == lent
    assert fitted_shape(shapes, 64, 2, [[0.0, 0.0], [5.0, 60.0], [5.0, 70.0]]) == lent
    # Between measured buckets the interpolation stands.
    assert fitted_shape(shapes, 12, 2, cheap) == borrowed_shape(shapes, 12, 2)
