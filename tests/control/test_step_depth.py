"""The step-depth rule: one depth per step for the whole batch, brute-force checked."""

from __future__ import annotations

import itertools
import random

import pytest

from gateway.control.depth_profile import DepthProfile
from gateway.control.step_depth import StepDepth, choose_step_depth, expected_tokens


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
