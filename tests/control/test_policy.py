"""The goodput policy on real depth profiles: a table of situations and the k it picks."""

from __future__ import annotations

import pytest

from gateway.control.depth_profile import DepthProfile
from gateway.control.exploration import may_pay_at_one
from gateway.control.policies import GoodputPolicy, PolicyInput, make_policy
from gateway.control.settings import ControllerSettings


def profile(*p: float) -> DepthProfile:
    return DepthProfile(tuple(p), (100.0,) * len(p))


FLAT_COST = tuple(1.0 + 0.05 * k for k in range(6))
STEEP_COST = tuple(1.0 + 1.0 * k for k in range(6))
PRIOR_LIKE = profile(0.7, 0.665, 0.632, 0.6, 0.57)
GOODPUT = GoodputPolicy(min_samples=8, hysteresis=0.03, min_dwell=4)

CASES = [
    # name, profile, cost, current k, samples, since_change, bounds, expected k
    (
        "high acceptance, cheap drafts",
        profile(0.9, 0.9, 0.9, 0.9, 0.9),
        FLAT_COST,
        3,
        50,
        50,
        (0, 5),
        5,
    ),
    ("low acceptance", profile(0.03, 0.1, 0.1, 0.1, 0.1), FLAT_COST, 3, 50, 50, (0, 5), 0),
    ("no longer pays", profile(0.9, 0.9, 0.9, 0.9, 0.9), STEEP_COST, 3, 50, 50, (0, 5), 0),
    ("collapsing depth", profile(0.9, 0.05, 0.2, 0.2, 0.2), FLAT_COST, 3, 50, 50, (0, 5), 1),
    # Cold start: the estimate is mostly its prior (0.7, decaying 5 % per position).
    ("cold start never steps up", PRIOR_LIKE, FLAT_COST, 3, 2, 50, (0, 5), 3),
    ("cold start steps down where k cannot pay", PRIOR_LIKE, STEEP_COST, 3, 2, 50, (0, 5), 0),
    ("cold start step down waits the dwell", PRIOR_LIKE, STEEP_COST, 3, 2, 1, (0, 5), 3),
    ("dwell keeps k", profile(0.9, 0.9, 0.9, 0.9, 0.9), FLAT_COST, 3, 50, 1, (0, 5), 3),
    ("k_max flag bound", profile(0.9, 0.9, 0.9, 0.9, 0.9), FLAT_COST, 3, 50, 50, (0, 2), 2),
    ("k_min flag bound", profile(0.1, 0.1, 0.1, 0.1, 0.1), FLAT_COST, 3, 50, 50, (2, 5), 2),
]


@pytest.mark.parametrize(
    ("name", "prof", "cost", "current", "samples", "since", "bounds", "expected"),
    CASES,
    ids=[case[0] for case in CASES],
)
def test_goodput_policy_table(
    name: str,
    prof: DepthProfile,
    cost: tuple[float, ...],
    current: int,
    samples: int,
    since: int,
    bounds: tuple[int, int],
    expected: int,
) -> None:
    policy = GoodputPolicy(min_samples=8, hysteresis=0.03, min_dwell=4)
    choice = policy.choose(PolicyInput(prof, samples, current, *bounds, since, cost))
    assert choice.k == expected, choice.reason


def test_hysteresis_holds_a_nearly_equal_k_until_the_evidence_is_ample() -> None:
    # E[tokens]: k=2 -> 1.5+0.25 = 1.75; k=3 -> 1.875 (+7 % before cost, +2.5 % after).
    # The margin is min(h, max(1 %, 2 se / E[2])): with 100 trials a position the gain
    # is within the evidence's spread (margin 2.4 %), with 10,000 it is not (1 %).
    cost = tuple(1.0 + 0.05 * k for k in range(6))
    policy = GoodputPolicy(min_samples=1, hysteresis=0.05, min_dwell=0)
    few = DepthProfile((0.5,) * 5, (30.0,) * 5)
    held = policy.choose(PolicyInput(few, 50, 2, 0, 5, 50, cost))
    assert held.k == 2
    assert held.reason == "hold"
    ample = DepthProfile((0.5,) * 5, (10_000.0,) * 5)
    assert policy.margin(PolicyInput(ample, 50, 2, 0, 5, 50, cost), 2, 3) == 0.01
    assert policy.choose(PolicyInput(ample, 50, 2, 0, 5, 50, cost)).k == 3
    eager = GoodputPolicy(min_samples=1, hysteresis=0.0, min_dwell=0)
    assert eager.choose(PolicyInput(few, 50, 2, 0, 5, 50, cost)).k == 3


def test_a_hold_for_want_of_evidence_names_the_deeper_depth_to_probe() -> None:
    """A hold below the estimate's best depth reaches for it (exploration probes it);
    a hold at the best, or above it, reaches for nothing."""
    cost = tuple(1.0 + 0.05 * k for k in range(6))
    policy = GoodputPolicy(min_samples=1, hysteresis=0.05, min_dwell=0)
    few = DepthProfile((0.5,) * 5, (30.0,) * 5)
    held = policy.choose(PolicyInput(few, 50, 2, 0, 5, 50, cost))
    best = max(range(6), key=lambda d: held.goodput[d])
    assert (held.k, held.reason, held.reach) == (2, "hold", best)
    assert best > 2
    at_best = policy.choose(PolicyInput(few, 50, best, 0, 5, 50, cost))
    assert (at_best.k, at_best.reach) == (best, None)
    above = policy.choose(PolicyInput(few, 50, best + 1, 0, 5, 50, cost))
    assert (above.k, above.reason, above.reach) == (best + 1, "hold", None)


def test_expected_tokens_formula() -> None:
    assert profile(0.5, 0.5).expected_tokens() == pytest.approx([1.0, 1.5, 1.75])
    assert profile(1.0, 0.0, 1.0).expected_tokens() == pytest.approx([1.0, 2.0, 2.0, 2.0])


def test_prior_extrapolates_unseen_depths() -> None:
    est = DepthProfile.estimate([90.0, 0.0, 0.0], [100.0, 0.0, 0.0], (0.7,), 4.0, 0.9)
    assert est.p[0] == pytest.approx((90 + 4 * 0.7) / 104)
    assert est.p[1] == pytest.approx(est.p[0] * 0.9)
    assert est.p[2] == pytest.approx(est.p[1] * 0.9)


def test_factory_by_name() -> None:
    settings = ControllerSettings(hysteresis=0.07, prior_output_tokens=48.0)
    policy = make_policy("goodput", settings)
    assert isinstance(policy, GoodputPolicy)
    assert (policy.hysteresis, policy.prior_output_tokens) == (0.07, 48.0)
    with pytest.raises(ValueError, match="unknown policy 'magic'; known: goodput"):
        make_policy("magic", settings)
    with pytest.raises(ValueError, match="controller-mode: static"):
        ControllerSettings(policy="static")  # one static: the flag


def test_the_first_tokens_price_decides_short_replies_not_long_ones() -> None:
    """Calibrated on a CPU at batch 1: a step costs 1.65x at k = 1 and the
    first token 2.6 steps at k = 0 against 4.5 at k = 1. A class accepting 80 % of first
    drafts gains 9 % per step at k = 1 (1.8 tokens for 1.65x); whether that pays depends
    on how many steps the reply has to earn the dearer first token back."""
    prof = profile(0.8, 0.5, 0.5, 0.5, 0.5)
    cost = (1.0, 1.65, 2.5, 3.3, 4.1, 4.9)
    first = (2.6, 4.5, 4.5, 4.6, 4.6, 4.6)
    policy = GoodputPolicy(min_samples=1, hysteresis=0.03, min_dwell=0)

    def k_for(length: float, first_token: tuple[float, ...] = first) -> int:
        inp = PolicyInput(prof, 50, 0, 0, 5, 50, cost, first_token, length)
        return policy.choose(inp).k

    assert k_for(16) == 0  # 16 / (2.6 + 15) = 0.91 against 16 / (4.5 + 15 / 1.09) = 0.88
    assert k_for(400) == 1  # 0.99 against 1.08: the first token is spread over 400 tokens
    assert k_for(16, ()) == 1  # without calibration: decode steps only, as before
    # Long replies give E / c, the decode-only goodput, whatever the first token costs.
    long = policy.choose(PolicyInput(prof, 50, 1, 0, 5, 50, cost, first, 1e9))
    assert long.goodput[1] == pytest.approx(1.8 / 1.65)


def test_a_class_at_k0_probes_hard_only_while_k1_could_pay() -> None:
    """Batch-1 costs of a CPU host (step 1.37x at k = 1, first token 2.2 -> 6.1 steps),
    30-token replies: k = 1 pays only from p_1 of about 0.55. Never measured (the prior's
    0.7, no trials) it could; measured at 0.2 over 400 drafts it cannot, nor over 10
    (upper bound 0.41)."""
    cost, first = (1.0, 1.37), (2.2, 6.1)

    def hopeful(p: float, trials: float) -> bool:
        prof = DepthProfile((p,), (trials,))
        inp = PolicyInput(prof, 50, 0, 0, 1, 50, cost, first, 30.0)
        return may_pay_at_one(GOODPUT, inp, 4.0)

    assert hopeful(0.7, 0.0)
    assert not hopeful(0.2, 400.0)
    assert not hopeful(0.2, 10.0)
    assert hopeful(0.5, 10.0)  # 0.5 +- 0.27: may pay


def test_a_probe_that_prefills_a_cached_prompt_again_cannot_pay() -> None:
    """The same batch-1 costs; a class whose k = 0 runs find 1,300 prompt tokens cached,
    which its k = 1 probe prefills again (0.14 steps a token on that CPU: 180 steps), does
    not probe hard even at the prior's 0.7; with nothing cached it does."""
    cost, first = (1.0, 1.37), (2.2, 6.1)
    prof = DepthProfile((0.7,), (0.0,))
    assert may_pay_at_one(GOODPUT, PolicyInput(prof, 50, 0, 0, 1, 50, cost, first, 30.0), 4.0)
    cached = PolicyInput(prof, 50, 0, 0, 1, 50, cost, first, 30.0, 1300 * 0.14)
    assert not may_pay_at_one(GOODPUT, cached, 4.0)


def test_leaving_k0_pays_the_prompt_a_deeper_request_prefills_again() -> None:
    """Concurrency 1 on a CPU: tool calls held at k = 0 would leave cold start on the
    prior's 0.7 alone and move to k = 1, whose requests prefill their ~400 cached
    prompt tokens again (0.5 to 0.6 s to the first token; 61 tokens/s against 88
    without speculation). With the switch priced (0.14 steps a token) the class
    stays at k = 0; with nothing to prefill again it moves. A class already deep is not
    held there by the price (it is paid only to leave k = 0)."""
    prof = profile(0.7, 0.665, 0.632, 0.6, 0.57)
    cost = (1.0, 1.37, 1.6, 1.8, 2.0, 2.2)
    first = (2.2, 6.1, 6.2, 6.3, 6.4, 6.5)
    policy = GoodputPolicy(min_samples=8, hysteresis=0.03, min_dwell=0)

    def choose(current: int, switch: float) -> int:
        return policy.choose(PolicyInput(prof, 20, current, 0, 5, 50, cost, first, 48.0, switch)).k

    assert choose(0, 0.0) > 0
    assert choose(0, 400 * 0.14) == 0
    assert choose(3, 400 * 0.14) == choose(3, 0.0) > 0
