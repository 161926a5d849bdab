"""The step-depth rule: one depth per step for the whole batch, brute-force checked."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest

from engine.step_rule import (
    ANCHOR_MARGIN,
    SPEC_COSTS_ARG,
    SPEC_NEWS_ARG,
    SPEC_VOTE_ARG,
    Estimates,
    StepArgs,
    StepCostTable,
    StepDepth,
    StepVote,
    choose_step_depth,
    expected_tokens,
    news_from_arg,
    vote_step_depth,
)
from gateway.control.cost_steps import BUCKETS, batch_bucket
from gateway.control.depth_profile import DepthProfile


def _brute_force(
    groups: list[tuple[list[float], int]], costs: list[float], floor: float | None
) -> float:
    """The best tokens per cost over every depth and every choice of who drafts (each
    request at 0 or d), with the guard checked on every request."""
    k_max = len(costs) - 1
    requests = [p for p, n in groups for _ in range(n)]
    best = len(requests) / costs[0]
    for d in range(1, k_max + 1):
        for drafting in itertools.product((False, True), repeat=len(requests)):
            gains = [
                expected_tokens(p, k_max)[d] if on else 1.0
                for p, on in zip(requests, drafting, strict=True)
            ]
            if floor is not None and any(g * costs[0] < floor * costs[d] for g in gains):
                continue
            best = max(best, sum(gains) / costs[d])
    return best


def _random_case(rng: random.Random) -> tuple[list[tuple[list[float], int]], list[float]]:
    k_max = rng.randint(1, 4)
    groups = [
        ([rng.uniform(0.0, 0.95) for _ in range(k_max)], rng.randint(1, 2))
        for _ in range(rng.randint(1, 3))
    ]
    costs = [1.0]
    for _ in range(k_max):
        costs.append(costs[-1] + rng.uniform(0.02, 0.6))
    return groups, costs


@pytest.mark.parametrize("floor", [None, 1.0, 0.9])
def test_it_finds_the_brute_force_optimum_on_small_random_batches(floor: float | None) -> None:
    rng = random.Random(7)
    for _ in range(300):
        groups, costs = _random_case(rng)
        choice = choose_step_depth(groups, costs, floor)
        assert choice.rate == pytest.approx(_brute_force(groups, costs, floor), rel=1e-9)
        requests = sum(n for _, n in groups)
        tokens = sum(
            n * (expected_tokens(p, choice.depth)[choice.depth] if on else 1.0)
            for (p, n), on in zip(groups, choice.drafts, strict=True)
        )
        assert choice.rate == pytest.approx(tokens / costs[choice.depth])
        assert choice.depth > 0 or choice.rate == pytest.approx(requests / costs[0])


def test_every_request_stays_at_zero_when_speculation_loses() -> None:
    # Each draft costs 0.8 of a step and is accepted half the time: a loss at every depth.
    choice = choose_step_depth([([0.5, 0.5, 0.5], 3), ([0.3, 0.3, 0.3], 2)], [1.0, 1.8, 2.6, 3.4])
    assert choice == StepDepth(0, (False, False), 5.0)


def test_a_class_that_loses_at_every_depth_holds_its_batch_at_zero_under_the_guard() -> None:
    strong, weak = ([0.9, 0.9, 0.9], 7), ([0.1, 0.1, 0.1], 1)
    costs = [1.0, 1.2, 1.4, 1.6]
    assert choose_step_depth([strong, weak], costs, floor=None).depth == 3
    guarded = choose_step_depth([strong, weak], costs, floor=1.0)
    assert guarded.depth == 0
    assert guarded.drafts == (False, False)


def test_a_tie_goes_to_the_shallower_depth() -> None:
    # E[tokens | 1] = 1.5 at 1.5x the cost: exactly as fast as not drafting.
    assert choose_step_depth([([0.5], 2)], [1.0, 1.5]).depth == 0
    # Depths 1 and 2 tie (2 tokens at cost 2; 3 at cost 3): the shallower wins.
    assert choose_step_depth([([1.0, 1.0], 1)], [1.0, 0.5, 0.75], floor=None).depth == 1


def test_an_empty_batch_gets_depth_zero() -> None:
    assert choose_step_depth([], [1.0, 1.1, 1.2]) == StepDepth(0, (), 0.0)
    assert choose_step_depth([([0.9], 0)], [1.0, 1.1]).drafts == (False,)


def test_a_request_with_nothing_to_gain_does_not_draft() -> None:
    choice = choose_step_depth([([0.9, 0.9], 4), ([0.0, 0.0], 1)], [1.0, 1.1, 1.2], floor=None)
    assert choice.depth == 2
    assert choice.drafts == (True, False)


def test_expected_tokens_is_the_depth_profiles() -> None:
    p = (0.8, 0.6, 0.5)
    profile = DepthProfile(p, (0.0, 0.0, 0.0))
    assert expected_tokens(p, 3) == pytest.approx(profile.expected_tokens())
    # Deeper than the estimates: the last position's value repeats.
    assert expected_tokens((0.5,), 2) == pytest.approx([1.0, 1.5, 1.75])


def test_a_step_needs_a_positive_cost_at_depth_zero() -> None:
    with pytest.raises(ValueError, match="c\\(B, 0\\) > 0"):
        choose_step_depth([([0.5], 1)], [0.0, 1.0])


# ---- the engine's side: votes, the cost table, the probe rule ---------------------------
def _table(rows: dict[int, tuple[float, ...]]) -> StepCostTable:
    return StepCostTable(tuple(rows), tuple(rows.values()), tuple(() for _ in rows))


def test_the_table_reads_the_cost_models_buckets() -> None:
    """Batch B reads the smallest bucket >= B, the last above it: `batch_bucket`."""
    table = StepCostTable(
        BUCKETS, tuple((1.0, float(b)) for b in BUCKETS), tuple(() for _ in BUCKETS)
    )
    for batch in range(1, 600):
        assert table.costs(batch, False)[1] == batch_bucket(batch)


def test_newcomers_add_their_first_drafts_at_each_depth() -> None:
    table = StepCostTable((1,), ((1.0, 1.2, 1.4),), ((3.0, 3.5, 4.5),))
    assert table.costs(1, False) == (1.0, 1.2, 1.4)
    assert table.costs(1, True) == (1.0, 1.7, 2.9)


@pytest.mark.parametrize(
    "raw",
    [
        None,
        [],
        {"buckets": [1], "decode": [[1.0, 1.1]]},  # no first-token rows
        {"buckets": [2, 1], "decode": [[1.0], [1.0]], "first": [[], []]},  # unsorted
        {"buckets": [1], "decode": [[0.0, 1.0]], "first": [[]]},  # c(B, 0) = 0
        {"buckets": [1], "decode": [["x"]], "first": [[]]},
    ],
)
def test_a_malformed_table_is_refused(raw: object) -> None:
    assert StepCostTable.from_arg(raw) is None


def test_table_and_vote_survive_their_wire_form() -> None:
    table = _table({1: (1.0, 1.1, 1.3), 4: (1.0, 1.2, 1.5)})
    vote = StepVote((0.8, 0.6), probe=2)
    args = StepArgs(vote, table).extra_args()
    assert StepCostTable.from_arg(args[SPEC_COSTS_ARG]) == table
    assert StepVote.from_arg(args[SPEC_VOTE_ARG]) == vote


def test_an_anchor_survives_its_wire_form() -> None:
    vote = StepVote((0.8, 0.6), class_id="chat", anchor=2)
    assert StepVote.from_arg(vote.to_arg()) == vote
    assert "anchor" not in StepVote((0.4,)).to_arg()  # none: the wire form is unchanged
    assert StepVote.from_arg({"p": [0.5]}) == StepVote((0.5,))


def _rates(p: tuple[float, ...], costs: list[float]) -> list[float]:
    return [e / c for e, c in zip(expected_tokens(p, len(costs) - 1), costs, strict=True)]


def test_the_step_keeps_to_an_anchor_within_the_margin_of_the_best() -> None:
    """Near-tied depths: the rule's best moves with the estimates' noise, the class's
    chosen depth (with the controller's hysteresis) does not; the step runs at the
    anchor where it reads within `ANCHOR_MARGIN` of the best, else at the best."""
    p = (0.9, 0.8, 0.7, 0.6)
    costs = [1.0, 1.2, 1.4, 1.6, 1.75]
    rates = _rates(p, costs)
    best = max(range(len(rates)), key=rates.__getitem__)
    near = [
        d for d in range(len(rates)) if d != best and rates[d] * (1 + ANCHOR_MARGIN) >= rates[best]
    ]
    far = [d for d in range(len(rates)) if rates[d] * (1 + ANCHOR_MARGIN) < rates[best]]
    assert near  # the case exercises both sides of the margin
    assert far
    assert choose_step_depth([(p, 1)], costs).depth == best
    for d in near:
        assert choose_step_depth([(p, 1)], costs, anchors=(d,)).depth == d
    for d in far:
        assert choose_step_depth([(p, 1)], costs, anchors=(d,)).depth == best
    # Of several anchors, the best one that qualifies; a depth past K is ignored.
    top = max(near, key=rates.__getitem__)
    assert choose_step_depth([(p, 1)], costs, anchors=(*near, *far, 9)).depth == top
    assert choose_step_depth([(p, 1)], costs, anchors=(d,), margin=0.0).depth == best


def test_an_anchor_never_breaks_the_guard_or_an_unrunnable_depth() -> None:
    """A depth at which a request of the step loses to depth 0 is no anchor, nor one
    the engine cannot run as one step."""
    strong, weak = (0.95, 0.9, 0.9), (0.5, 0.1, 0.05)
    costs = [1.0, 1.3, 1.45, 1.6]
    guarded = choose_step_depth([(strong, 3), (weak, 1)], costs)
    assert guarded.depth < 3
    # Depth 3 loses the weak request its speed: no anchor takes the step there.
    assert choose_step_depth([(strong, 3), (weak, 1)], costs, anchors=(3,), margin=1.0).depth == (
        guarded.depth
    )
    table = _table({1: (1.0, 1.05, 1.1, 1.15)})
    vote = StepVote((0.9, 0.9, 0.2), anchor=2)
    assert vote_step_depth([replace(vote, anchor=-1)], table, 1, False) == 3
    assert vote_step_depth([vote], table, 1, False) == 2
    assert vote_step_depth([vote], table, 1, False, allowed=(1, 3)) == 3


def test_a_riders_vote_survives_its_wire_form() -> None:
    rider = StepVote((0.4, 0.2), class_id="tools", rides=True)
    assert StepVote.from_arg(rider.to_arg()) == rider
    assert "rides" not in StepVote((0.4,)).to_arg()  # a voter's wire form is unchanged


def test_riders_count_at_their_gain_without_a_guard_or_a_say() -> None:
    """A rider verifies the voters' depth: its E(d) counts in the step's tokens, so a
    weak rider deepens the step over one that verifies none; it is never guarded (the
    step runs at the voters' depth whatever it does), and riders alone run at 0."""
    table = _table({4: (1.0, 1.3, 1.6, 1.9, 2.2)})
    strong, weak = (0.9, 0.85, 0.8, 0.75), (0.2, 0.1, 0.1, 0.1)
    voter = StepVote(strong, class_id="chat")
    rider = StepVote(weak, class_id="tools", rides=True)
    costs = table.costs(4, False)
    beside_plain = vote_step_depth([voter], table, 4, False, riders=3)
    assert beside_plain == choose_step_depth([(strong, 1)], costs, 1.0, [((), 3)]).depth
    with_riders = vote_step_depth([voter, rider, rider, rider], table, 4, False)
    assert with_riders == choose_step_depth([(strong, 1)], costs, 1.0, [(weak, 3)]).depth
    assert with_riders > beside_plain
    # As a voter the weak class guards the step: its drafts lose at every depth.
    assert vote_step_depth([voter] + [StepVote(weak)] * 3, table, 4, False) == 0
    assert vote_step_depth([rider, rider], table, 2, False) == 0
    # A probe still sets the depth only where its class is the whole step.
    probe = StepVote(strong, probe=4, class_id="chat")
    assert vote_step_depth([probe, rider], table, 2, False) < 4


@pytest.mark.parametrize(
    "raw",
    [
        None,
        {},
        {"p": []},
        {"p": [1.5]},
        {"p": ["a"]},
        {"p": [0.5], "probe": "2"},
        {"p": [0.5], "rides": "yes"},
        {"p": [0.5], "anchor": "2"},
        {"p": [0.5], "anchor": True},
    ],
)
def test_a_malformed_vote_is_refused(raw: object) -> None:
    assert StepVote.from_arg(raw) is None


def test_votes_group_by_class_and_match_the_rule() -> None:
    table = _table({8: (1.0, 1.15, 1.3, 1.5)})
    strong, weak = (0.9, 0.8, 0.7), (0.3, 0.2, 0.1)
    votes = [StepVote(strong)] * 3 + [StepVote(weak)]
    want = choose_step_depth([(strong, 3), (weak, 1)], table.costs(4, False)).depth
    assert vote_step_depth(votes, table, 4, False) == want
    assert vote_step_depth([], table, 4, False) == 0


def test_only_allowed_depths_are_chosen() -> None:
    table = _table({1: (1.0, 1.05, 1.1, 2.0)})
    vote = StepVote((0.9, 0.9, 0.9))
    assert vote_step_depth([vote], table, 1, False) == 2
    assert vote_step_depth([vote], table, 1, False, allowed=(1, 3)) in (1, 3)
    assert vote_step_depth([vote], table, 1, False, allowed=(3,)) in (0, 3)


def test_a_probe_sets_the_depth_only_where_its_class_is_the_whole_step() -> None:
    table = _table({4: (1.0, 1.1, 1.2, 1.3, 1.4)})
    chat = (0.7, 0.3, 0.2, 0.1)
    base = vote_step_depth([StepVote(chat)], table, 2, False)
    assert base < 4
    probe = StepVote(chat, probe=4)
    assert vote_step_depth([probe, StepVote(chat)], table, 2, False) == 4
    assert vote_step_depth([probe], table, 1, False, allowed=(1, 2)) == base  # 4 not allowed
    other = StepVote((0.6, 0.3, 0.2, 0.1))
    mixed = vote_step_depth([probe, other], table, 2, False)
    assert mixed == vote_step_depth([StepVote(chat), other], table, 2, False)
    assert vote_step_depth([StepVote(chat, probe=9)], table, 1, False) == 4  # clamped to K


def test_riders_pay_the_steps_time_and_never_gain_from_it() -> None:
    """Requests without a vote verify none at any depth: one token a step each, a riding
    group without acceptance. Alone a strong voter drafts; beside enough riders the
    step's time outweighs its gain, and the riders (who gain nothing by construction) do
    not trip the guard."""
    costs = [1.0, 1.3, 1.6]
    strong = ((0.9, 0.9), 1)
    assert choose_step_depth([strong], costs).depth == 2
    # d = 2: (1 + 0.9 + 0.81 + riders) / 1.6 against (1 + riders) / 1.0 at d = 0
    assert choose_step_depth([strong], costs, riding=[((), 1)]).depth == 2  # 4.71 / 1.6 > 2
    assert choose_step_depth([strong], costs, riding=[((), 4)]).depth == 0  # 6.71 / 1.6 < 5
    counted = choose_step_depth([strong], costs, riding=[((), 1)])
    assert counted.rate == pytest.approx((1 + 0.9 + 0.81 + 1) / 1.6)
    assert counted.drafts == (True,)
    # the guard reads the voters only: with riders it still lets the voters draft
    assert choose_step_depth([strong], costs, floor=1.0, riding=[((), 1)]).depth == 2


def test_a_probe_does_not_set_the_depth_of_a_step_with_riders() -> None:
    table = _table({64: (1.0, 2.0, 3.0, 4.0, 5.0)})
    probe = StepVote((0.7, 0.3, 0.2, 0.1), probe=1)
    assert vote_step_depth([probe], table, 1, False) == 1  # its class is the whole step
    # 63 requests without a vote would pay a step twice as dear for its one draft
    assert vote_step_depth([probe], table, 64, False, riders=63) == 0


def test_estimates_keep_each_classes_newest_and_voters_read_them() -> None:
    table = _table({4: (1.0, 1.1, 1.2, 1.3, 1.4)})
    old = StepVote((0.9, 0.9, 0.9, 0.9), class_id="chat")
    estimates = Estimates()
    estimates.take(old, {})
    assert vote_step_depth([old], table, 1, False, estimates=estimates) == 4
    # A later request of another class brings chat's newer, poor estimates.
    code = StepVote((0.8, 0.7, 0.6, 0.5), class_id="code")
    estimates.take(code, {"chat": (0.05, 0.05, 0.05, 0.05)})
    assert estimates.current(old) == (0.05, 0.05, 0.05, 0.05)
    assert vote_step_depth([old], table, 1, False, estimates=estimates) == 0
    assert vote_step_depth([old], table, 1, False) == 4  # without: its admission's
    assert estimates.current(StepVote((0.5,))) == (0.5,)  # no class: its own


def test_estimates_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Estimates, "MAX_CLASSES", 3)
    estimates = Estimates()
    for i in range(5):
        estimates.take(StepVote((0.1 * (i + 1),), class_id=f"c{i}"), {})
    assert estimates.current(StepVote((0.9,), class_id="c0")) == (0.9,)  # dropped
    assert estimates.current(StepVote((0.9,), class_id="c4")) == (0.5,)


def test_news_survive_their_wire_form_and_bad_entries_are_dropped() -> None:
    args = StepArgs(
        StepVote((0.5,), class_id="a"), _table({1: (1.0, 1.1)}), {"b": (0.25, 0.5)}
    ).extra_args()
    assert news_from_arg(args[SPEC_NEWS_ARG]) == {"b": (0.25, 0.5)}
    assert StepVote.from_arg(args[SPEC_VOTE_ARG]) == StepVote((0.5,), class_id="a")
    assert news_from_arg({"b": [2.0], "": [0.5], "c": "x", "d": [0.5]}) == {"d": (0.5,)}
    assert news_from_arg(None) == {}
