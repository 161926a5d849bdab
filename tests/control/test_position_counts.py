"""Per-position trials of a request whose steps drafted different depths.

A per-step depth (the CUDA engine's one depth per step, the one-draft prefill step)
makes a request's steps differ in depth. Its marginal counts cannot say which steps
that accepted position d - 1 drafted position d; the joint count can."""

from __future__ import annotations

from dataclasses import replace

import pytest

from engine.interface import RequestOutcome, SpeculationOutcome
from gateway.control.stats import ClassStats, position_counts


def _steps(steps: list[tuple[int, int]]) -> SpeculationOutcome:
    """A request's outcome from its (drafts, accepted) per verify step, as the engines
    count it."""
    depth = max(n for n, _ in steps)
    return SpeculationOutcome(
        k=depth,
        verify_steps=len(steps),
        draft_tokens=sum(n for n, _ in steps),
        accepted_tokens=sum(a for _, a in steps),
        accepted_per_position=tuple(sum(1 for _, a in steps if a > d) for d in range(depth)),
        drafted_per_position=tuple(sum(1 for n, _ in steps if n > d) for d in range(depth)),
        tried_per_position=tuple(
            sum(1 for n, a in steps if n > d and a >= d) for d in range(depth)
        ),
    )


def test_the_joint_count_gives_the_trials_of_each_position() -> None:
    # 10 steps at depth 1 (6 accepted), 10 at depth 2 (6 accepted the first, 3 of them
    # the second): P(accept 2 | accepted 1) = 3 / 6, not 3 / min(12, 10).
    steps = [(1, 1)] * 6 + [(1, 0)] * 4 + [(2, 2)] * 3 + [(2, 1)] * 3 + [(2, 0)] * 4
    accepted, trials = position_counts(_steps(steps), 2)
    assert (accepted, trials) == ([12, 3], [20, 6])
    stats = ClassStats(positions=2)
    stats.add_outcome(RequestOutcome("r", 8, 40, "length", _steps(steps)))
    assert stats.accepted_at[1] / stats.trials_at[1] == pytest.approx(0.5)


def test_without_the_joint_count_the_marginals_overcount_a_mixed_request() -> None:
    steps = [(1, 1)] * 6 + [(1, 0)] * 4 + [(2, 2)] * 3 + [(2, 1)] * 3 + [(2, 0)] * 4
    spec = _steps(steps)
    marginal = replace(spec, tried_per_position=())
    # min(accepted at 1, drafted at 2) = min(12, 10): p_2 read as 0.3 instead of 0.5.
    assert position_counts(marginal, 2) == ([12, 3], [20, 10])


def test_one_depth_throughout_gives_the_same_trials_either_way() -> None:
    steps = [(3, 3), (3, 1), (3, 0), (3, 2), (3, 3)]
    spec = _steps(steps)
    marginal = replace(spec, tried_per_position=())
    assert position_counts(spec, 3) == position_counts(marginal, 3) == ([4, 3, 2], [5, 4, 3])
