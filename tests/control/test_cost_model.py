"""The cost model learns step costs that are not linear in k (as measured on CPU)."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from engine.interface import RequestOutcome, SpeculationOutcome
from gateway.control.cost_first_token import chain_fit, non_decreasing
from gateway.control.cost_model import (
    REVISIT_CHECK,
    REVISIT_WEIGHT,
    STALE_STEPS,
    STEPS_PER_REFRESH,
    CostModel,
)
from gateway.control.exploration import Exploration
from gateway.control.settings import ControllerSettings

#: Seconds per decode step at k = 0..4, read off the embedded model's benchmark at
#: concurrency 1 (bench/results/report.md, static modes): a large first-draft cost,
#: small increments, then a jump at k = 4.
MEASURED = (0.0073, 0.0110, 0.0116, 0.0130, 0.0176)


def _model() -> CostModel:
    return CostModel(
        max_k=4,
        prior_step_s=0.02,
        prior_k_cost=0.08,
        prior_batch_saturation=16.0,
        prior_weight=2.0,
        forgetting=0.01,
    )


def thin_depths(model: CostModel, batch: int, min_samples: float) -> list[int]:
    """The depths exploration measures first at this load (`Exploration.thin_depths`)."""
    return Exploration(model, ControllerSettings(), random.Random(0)).thin_depths(
        batch, min_samples
    )


def _calibrated(costs: tuple[float, ...], batch: int, rounds: int) -> CostModel:
    """A model that has seen `rounds` uniform batches at every depth (start-up calibration)."""
    model = _model()
    for _ in range(rounds):
        for k, seconds in enumerate(costs):
            model.observe(k, batch, seconds)
    return model


def test_each_depth_converges_to_its_own_measured_cost() -> None:
    model = _model()
    for _ in range(30):
        for k, seconds in enumerate(MEASURED):
            model.observe(k, 1, seconds)
    want = [s / MEASURED[0] for s in MEASURED]
    assert model.relative_costs(1) == pytest.approx(want, rel=0.06)


def test_a_line_through_deep_data_alone_is_not_trusted_for_k0() -> None:
    """Data only at k = 3..4: k = 0 is a thin depth, to be measured, not extrapolated."""
    model = _model()
    for _ in range(40):
        model.observe(3, 1, MEASURED[3])
        model.observe(4, 1, MEASURED[4])
    assert thin_depths(model, 1, 3) == [0, 1, 2]
    for _ in range(10):
        model.observe(0, 1, MEASURED[0])
    assert 0 not in thin_depths(model, 1, 3)
    assert model.relative_costs(1)[3] == pytest.approx(MEASURED[3] / MEASURED[0], rel=0.1)


def test_per_depth_costs_travel_between_replicas() -> None:
    a, b = _model(), _model()
    for _ in range(20):
        for k, seconds in enumerate(MEASURED):
            a.observe(k, 1, seconds)
    b.merge_counters(a.export_counters())
    assert thin_depths(b, 1, 3) == []
    assert b.relative_costs(1) == pytest.approx(a.relative_costs(1), rel=0.05)


def test_a_refit_at_one_load_leaves_other_loads_decisions_cached() -> None:
    """Decisions cache on their own bucket's version: busy loads do not re-run idle ones."""
    model = _model()
    idle, busy = 1, 16
    before = model.bucket_version(idle)
    for _ in range(40):
        model.observe(2, busy, 0.02)
    assert model.bucket_version(busy) > 0
    assert model.bucket_version(idle) == before
    model.observe(2, idle, 0.01)
    assert model.bucket_version(idle) > before


def test_small_cost_moves_keep_decisions_cached_but_cannot_add_up_unseen() -> None:
    """A sample that moves no relative cost by over 1 % leaves the version; drift does not."""
    model = _model()
    for _ in range(40):
        for k, seconds in enumerate(MEASURED):
            model.observe(k, 1, seconds)
    settled = model.bucket_version(1)
    model.observe(2, 1, MEASURED[2])  # the same cost again: nothing moved
    assert model.bucket_version(1) == settled
    # k = 4 slowly gets dearer, each sample a small step; the version must follow.
    start = model.relative_costs(1)[4]
    seconds = MEASURED[4]
    while model.relative_costs(1)[4] < start * 1.05:
        seconds *= 1.002
        model.observe(4, 1, seconds)
    assert model.bucket_version(1) > settled


def test_a_probe_in_a_deep_batch_is_filed_at_the_batch_depth() -> None:
    """A k = 0 request in a batch of k = 4 requests paid k = 4 steps: cost(0) must not learn it.

    Filed under its own k (the old behaviour) the dear step made k = 0 look as
    costly as k = 4 and speculation look free; the probe still counts as made.
    """
    model = _calibrated(MEASURED, 4, 30)
    before = model.relative_costs(4)
    for _ in range(30):
        model.observe(0, 4, MEASURED[4], depth=4.0)
    after = model.relative_costs(4)
    assert after[4] == pytest.approx(before[4], rel=0.1)
    assert thin_depths(model, 4, 3) == []
    # The same steps filed under the probe's own k would have made k = 4 look cheap.
    naive = _calibrated(MEASURED, 4, 30)
    for _ in range(30):
        naive.observe(0, 4, MEASURED[4])
    assert naive.relative_costs(4)[4] < 0.6 * after[4]


def test_a_request_whose_batch_changed_depth_is_filed_at_none() -> None:
    """A batch that ran at depth 1 for half a request's life and at 2 for the other half
    cost between the two; filed at both, it pulled each depth's mean towards the other
    (concurrency 4 on the CPU: a step at k = 1 came to look as cheap as one at k = 0).
    Near a whole depth (within MIXED_DEPTH) it is filed there."""
    model = _model()
    for _ in range(40):
        model.observe(1, 1, 0.010, depth=0.0)
        model.observe(1, 1, 0.030, depth=2.0)
        model.observe(1, 1, 0.020, depth=1.0)
    before = model.relative_costs(1)
    for _ in range(40):
        model.observe(1, 1, 0.040, depth=1.5)
    assert model.relative_costs(1) == pytest.approx(before, rel=0.02)
    for _ in range(40):
        model.observe(1, 1, 0.040, depth=1.05)
    assert model.relative_costs(1)[1] > 1.3 * before[1]
    assert model.relative_costs(1)[2] == pytest.approx(before[2], rel=0.02)
    assert thin_depths(model, 1, 3) == [0, 2, 3, 4]  # probes counted at their own k only


def test_probe_counts_travel_between_replicas_at_the_own_k() -> None:
    a, b = _model(), _model()
    for _ in range(5):
        a.observe(0, 4, MEASURED[4], depth=4.0)
    b.merge_counters(a.export_counters())
    assert 0 not in thin_depths(b, 4, 3)
    assert 4 in thin_depths(b, 4, 3)


def test_a_depth_the_traffic_leaves_keeps_its_measured_cost() -> None:
    """Calibrated depths stay calibrated while traffic runs at one depth only.

    With every depth's mean decayed by every sample, 300 requests at k = 2 left
    k = 0 and k = 4 to the line, whose prior slope is a GPU's: k = 4 looked cheap
    and classes crept deeper (benchmark at concurrency 4).
    """
    steep = (0.015, 0.025, 0.039, 0.048, 0.059)  # start-up calibration, batch 4, on CPU
    model = _calibrated(steep, 4, 4)
    calibrated = model.relative_costs(4)
    for _ in range(300):
        model.observe(2, 4, steep[2], depth=2.0)
    assert model.relative_costs(4) == pytest.approx(calibrated, rel=0.1)


def test_first_token_costs_are_calibrated_seconds_in_steps_at_k0() -> None:
    """Start-up calibration measures the first token at each depth; the policy gets it in
    steps at k = 0 of the bucket, and a bucket without its own calibration borrows the
    nearest calibrated bucket's seconds (in its own step units)."""
    model = _calibrated(MEASURED, 1, 8)
    model.observe(0, 16, 0.032)
    assert model.first_token(1) == ()  # not measured: the policy weighs steps only
    before = model.bucket_version(1)
    first = (0.030, 0.070, 0.070, 0.072, 0.075)
    for k, seconds in enumerate(first):
        model.calibrate_first_token(k, 1, seconds)
    assert model.bucket_version(1) > before  # cached decisions must see the new term
    step0 = MEASURED[0]
    assert model.first_token(1) == pytest.approx([s / step0 for s in first], rel=0.05)
    assert model.first_token(16) == pytest.approx([s / 0.032 for s in first], rel=0.05)
    model.calibrate_first_token(0, 8, 0.25)  # one depth measured at 8: the others borrow it
    assert model.first_token(16) == pytest.approx([0.25 / 0.032] * 5, rel=0.05)
    report = {b["batch_bucket"]: b for b in model.report()}
    assert report[1]["first_token"] == pytest.approx(model.first_token(1), abs=1e-3)


@pytest.mark.parametrize(
    ("values", "fitted"),
    [
        ((1.0, 2.0, 3.0), (1.0, 2.0, 3.0)),
        ((3.0, 1.0), (2.0, 2.0)),
        ((1.0, 1.543, 1.464, 1.842, 2.052, 1.783), (1.0, 1.5035, 1.5035, 1.842, 1.9175, 1.9175)),
        ((5.0,), (5.0,)),
        ((), ()),
    ],
)
def test_non_decreasing_is_the_pool_adjacent_violators_fit(
    values: tuple[float, ...], fitted: tuple[float, ...]
) -> None:
    assert non_decreasing(values) == pytest.approx(fitted, abs=1e-4)


def test_first_token_prices_never_fall_with_depth() -> None:
    """A burst's noise can time a deeper first chain below a shallower one; the prices the
    policy and the step rule read are the chain's least-squares fit, f(0) + j + s k with
    j, s >= 0: here the depths' slope would be negative, so s = 0 and every depth above
    0 reads their mean."""
    model = _calibrated(MEASURED, 1, 8)
    noisy = (0.030, 0.052, 0.048, 0.060, 0.041)
    for k, seconds in enumerate(noisy):
        model.calibrate_first_token(k, 1, seconds)
    prices = model.first_token(1)
    assert all(b >= a for a, b in itertools.pairwise(prices))
    step0 = MEASURED[0]
    mean = sum(noisy[1:]) / 4
    want = (0.030, mean, mean, mean, mean)
    assert prices == pytest.approx([s / step0 for s in want], rel=0.05)


def test_the_chain_fit_reads_the_drafts_price_through_the_rounds_noise() -> None:
    """At batch 64 on a GPU a draft adds a few hundredths of a step to the first token and
    a burst's noise some tenths: depth by depth the noise orders the prices; the chain's
    fit over all depths recovers the slope, and every depth reads it."""
    rng = random.Random(7)
    truth = [4.3 + (0.1 if d else 0.0) + 0.035 * d for d in range(8)]
    errors_fit, errors_raw = [], []
    for _ in range(200):
        seen = [t * rng.lognormvariate(0.0, 0.05 / math.sqrt(2)) for t in truth]
        a, j, s = chain_fit(range(8), seen)
        assert min(j, s) >= 0
        fitted = [a + (j if d else 0.0) + s * d for d in range(8)]
        # What the step rule weighs: a newcomers' step at depth 3 over one at depth 1.
        errors_fit.append(abs((fitted[3] - fitted[1]) - (truth[3] - truth[1])))
        errors_raw.append(abs((seen[3] - seen[1]) - (truth[3] - truth[1])))
    assert statistics.median(errors_fit) < 0.4 * statistics.median(errors_raw)
    assert statistics.median(errors_fit) < 0.07


@pytest.mark.parametrize(
    ("depths", "seconds", "fit"),
    [
        ((0, 1, 2, 3), (1.0, 2.0, 2.5, 3.0), (1.0, 0.5, 0.5)),  # a jump and a slope
        ((0, 1, 2, 3), (1.0, 2.0, 3.0, 4.0), (1.0, 0.0, 1.0)),  # a line
        ((0, 2, 4), (1.0, 3.0, 3.0), (1.0, 2.0, 0.0)),  # a jump: the slope would be < 0
        ((0, 1, 2), (3.0, 2.0, 1.0), (2.0, 0.0, 0.0)),  # falling: the level alone
    ],
)
def test_chain_fit_is_the_least_squares_fit_with_nonnegative_jump_and_slope(
    depths: tuple[int, ...], seconds: tuple[float, ...], fit: tuple[float, float, float]
) -> None:
    assert chain_fit(depths, seconds) == pytest.approx(fit, abs=1e-9)


def test_steps_that_carried_other_requests_prefill_are_filed_at_no_depth() -> None:
    """A request that shared its life with long prompts measured their prefill, not its
    decode steps: above PREFILL_PER_STEP prompt tokens per step per request it moves no
    depth's cost (it still counts as a run at its own k)."""
    model = _calibrated(MEASURED, 4, 8)
    before = model.relative_costs(4)
    outcome = RequestOutcome(
        "r",
        prompt_tokens=40,
        output_tokens=32,
        finish_reason="length",
        speculation=SpeculationOutcome(k=0),
        ttft_s=0.05,
        e2e_s=0.05 + 31 * 0.1,  # 100 ms a step: a 1,300-token prompt ran alongside
        decode_steps=32,
    )
    for _ in range(40):
        model.observe_outcome(outcome, 4, 0.0, prefill=4 * 32 * 4)  # 4 tokens/step/request
    # Unmoved up to the periodic refit of the bucket's line (REFIT_EVERY samples), which
    # catches up with the last calibration samples.
    assert model.relative_costs(4) == pytest.approx(before, rel=0.01)
    assert thin_depths(model, 4, 8 + 40) == [1, 2, 3, 4]  # counted as runs at k = 0
    for _ in range(40):
        model.observe_outcome(outcome, 4, 0.0, prefill=32 * 4)  # 1 token/step/request
    assert model.relative_costs(4)[1] < 0.5 * before[1]  # k = 0 now looks dear


def test_engine_steps_take_over_from_requests_once_they_arrive() -> None:
    """Calibration's requests set the first prices; once the engine times its steps,
    those are filed (one sample each, at the batch's depth) and a finished request only
    counts as a run at its k: its mean over its life would file the same steps twice."""
    model = _calibrated((0.010, 0.013, 0.015, 0.017, 0.019), batch=4, rounds=4)
    filed_before = model.report()[0]["filed"]
    assert isinstance(filed_before, list)
    for _ in range(300):
        model.observe_step(4, 1, 0.020)  # k = 1 now costs 2x k = 0's calibrated price
        model.observe_step(3, 0, 0.010)
    costs = model.relative_costs(4)
    assert costs[1] == pytest.approx(2.0, rel=0.02)
    before = model.report()[0]
    model.observe(2, 4, 0.050)  # a request's own mean: counted, not filed
    after = model.report()[0]
    assert after["samples"][2] == before["samples"][2] + 1  # type: ignore[index]
    assert after["filed"] == before["filed"]
    assert model.relative_costs(4) == costs
    # Steps forget per step of their own depth: 300 steps at 0.002 leave the
    # calibration's 4 samples at 0.55 of their weight, the steps' own weight near 226.
    assert after["filed"][1] == pytest.approx(  # type: ignore[index]
        filed_before[1] * 0.998**300 + (1 - 0.998**300) / 0.002, rel=0.01
    )


def test_steps_outside_the_depths_are_ignored() -> None:
    model = _calibrated(MEASURED, batch=1, rounds=3)
    costs = model.relative_costs(1)
    model.observe_step(1, 9, 0.5)
    model.observe_step(1, 2, 0.0)
    assert model.relative_costs(1) == costs


def test_one_stalled_step_is_filed_at_a_bound_not_its_length() -> None:
    """A one-second stall among 12 ms steps moves the depth's cost by what a step of
    3x the mean would, not by the stall's length."""
    stalled, steady = _model(), _model()
    for model in (stalled, steady):
        for _ in range(200):
            model.observe_step(4, 0, 0.010)
            model.observe_step(4, 2, 0.012)
    stalled.observe_step(4, 2, 1.0)
    steady.observe_step(4, 2, 0.036)  # the bound: 3x the mean
    for _ in range(7):  # to the next recomputation
        stalled.observe_step(4, 0, 0.010)
        steady.observe_step(4, 0, 0.010)
    assert stalled.relative_costs(4) == pytest.approx(steady.relative_costs(4), rel=1e-9)
    # Filed whole, the stall would have put k = 2 near 1.8x k = 0 (one sample of about
    # 167 carrying 83x the mean); bounded it moves 1.2x by about 1 %.
    assert stalled.relative_costs(4)[2] < 1.2 * 1.02


def step_calibrated(step_ms: tuple[float, ...], batch: int, steps: int) -> CostModel:
    """A model whose start-up calibration filed `steps` engine steps at every depth
    and counted four requests run at each (`gateway.calibration` does both)."""
    model = _model()
    for _ in range(steps):
        for k, ms in enumerate(step_ms):
            model.observe_step(batch, k, ms / 1000)
    for k, ms in enumerate(step_ms):
        for _ in range(4):
            model.observe(k, batch, ms / 1000)
    return model


def test_a_depth_the_traffic_left_is_re_measured_at_batch_1_when_the_host_changed() -> None:
    """Calibration ran on a busy host (k = 0 at 10 ms, k = 2 at 15 ms: 1.5x); the
    traffic then ran at k = 2 alone on a host 1.5x faster (10 ms). Divided by k = 0's
    busy price, k = 2 looks as cheap as k = 0 (a test gateway kept tool calls at k = 2
    so). Past STALE_STEPS k = 0, which every relative cost divides by, is named for
    exploration; a probe's few dozen steps at k = 0 price it on the changed host (its
    old samples weigh REVISIT_WEIGHT), and k = 2 is back near 1.5x."""
    model = step_calibrated((10.0, 12.0, 15.0, 17.0, 19.0), batch=1, steps=100)
    assert model.relative_costs(1)[2] == pytest.approx(1.5, rel=0.02)
    assert thin_depths(model, 1, 3.0) == []
    for _ in range(STALE_STEPS + STEPS_PER_REFRESH):
        model.observe_step(1, 2, 0.010)
    assert model.relative_costs(1)[2] < 1.1  # the two hosts' prices mixed
    assert thin_depths(model, 1, 3.0) == [0]
    assert model.report()[0]["stale"] == [0]
    for _ in range(40):  # one probe request at k = 0, on the faster host
        model.observe_step(1, 0, 0.010 / 1.5)
    assert model.relative_costs(1)[2] == pytest.approx(1.5, rel=0.08)
    assert thin_depths(model, 1, 3.0) == []


def test_stale_depths_are_not_probed_under_load_but_revisits_forget_them() -> None:
    """In a batch of 4 the step runs at its deepest request's depth, so a probe at
    k = 0 measures nothing there: no re-measuring. A depth the batch comes back to is
    still priced by the changed host's steps within a few dozen."""
    model = step_calibrated((10.0, 12.0, 15.0, 17.0, 19.0), batch=4, steps=100)
    for _ in range(STALE_STEPS + STEPS_PER_REFRESH):
        model.observe_step(4, 2, 0.010)
    assert thin_depths(model, 4, 3.0) == []
    for _ in range(40):
        model.observe_step(4, 0, 0.010 / 1.5)
    assert model.relative_costs(4)[2] == pytest.approx(1.5, rel=0.08)


def test_a_depth_visited_again_on_an_unchanged_host_keeps_its_weight() -> None:
    """After STALE_STEPS at other depths, a depth whose first REVISIT_CHECK steps
    confirm its old price keeps its samples' weight: its price does not fall back on a
    few fresh, noisy steps."""
    model = step_calibrated((10.0, 12.0, 15.0, 17.0, 19.0), batch=4, steps=300)
    before = model.report()[0]["filed"]
    assert isinstance(before, list)
    for _ in range(STALE_STEPS + STEPS_PER_REFRESH):
        model.observe_step(4, 2, 0.015)  # k = 2, at its calibrated price
    for i in range(REVISIT_CHECK + 4):
        model.observe_step(4, 4, 0.019 * (1.03 if i % 2 else 0.97))  # k = 4, as before
    filed = model.report()[0]["filed"]
    assert isinstance(filed, list)
    assert filed[4] > before[4]  # its old weight, and the new steps
    assert model.relative_costs(4)[4] == pytest.approx(1.9, rel=0.01)


def test_a_depth_visited_again_on_a_changed_host_is_priced_by_the_fresh_steps() -> None:
    """The host slowed by 1.5x while the traffic ran at k = 2: k = 4's first
    REVISIT_CHECK steps are 1.5x its old mean, so its old samples are cut to
    REVISIT_WEIGHT and the fresh steps price it."""
    model = step_calibrated((10.0, 12.0, 15.0, 17.0, 19.0), batch=4, steps=300)
    for _ in range(STALE_STEPS + STEPS_PER_REFRESH):
        model.observe_step(4, 2, 0.015 * 1.5)
    for _ in range(REVISIT_CHECK - 1):
        model.observe_step(4, 4, 0.019 * 1.5)
    undecided = model.report()[0]["filed"]
    assert isinstance(undecided, list)
    assert undecided[4] > 100  # the old samples still weigh their few hundred
    model.observe_step(4, 4, 0.019 * 1.5)
    filed = model.report()[0]["filed"]
    assert isinstance(filed, list)
    assert filed[4] == pytest.approx(REVISIT_WEIGHT + REVISIT_CHECK, rel=0.01)
    for _ in range(STEPS_PER_REFRESH):
        model.observe_step(4, 4, 0.019 * 1.5)
    # k = 2 and k = 4 both priced on the slower host: 1.9 / 1.5 apart, as calibrated
    # (less the old sample's pull); uncut, k = 4's old mean would read 0.85.
    costs = model.relative_costs(4)
    assert costs[4] / costs[2] == pytest.approx(1.9 / 1.5, rel=0.05)


def test_a_visited_depth_keeps_its_weight() -> None:
    """Only a gap of STALE_STEPS cuts a depth's weight: steps at every depth in turn
    keep each depth's forgetting mean as before."""
    model = step_calibrated((10.0, 12.0, 15.0, 17.0, 19.0), batch=1, steps=600)
    filed = model.report()[0]["filed"]
    assert isinstance(filed, list)
    assert filed[0] == pytest.approx((1 - 0.998**600) / 0.002, rel=0.01)
    assert thin_depths(model, 1, 3.0) == []
