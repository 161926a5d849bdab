"""The draft budget of vLLM 0.33's adaptive verification (`engine.verify_budget`), by hand."""

from __future__ import annotations

import pytest

from engine.verify_budget import (
    CostCurves,
    admitted_drafts,
    assign_budget,
    cost_tables,
    step_budget,
    survival,
)

FLAT = CostCurves(draft_ms=(0.0, 1.0, 1.0), verify_ms=(0.0, 1.0, 1.0, 1.0, 1.0))
STEEP = CostCurves(draft_ms=(0.0, 1.0), verify_ms=(0.0, 1.0, 3.0, 5.0))
#: Two requests, no drafter cost, the target 2 ms at 2 tokens and 0.5 ms per token more.
PAIR = CostCurves(draft_ms=(0.0, 0.0, 0.0), verify_ms=(0.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0))


def test_survival_is_the_running_product_up_to_the_cap() -> None:
    assert survival([0.5, 0.5, 0.5], 2) == [0.5, 0.25]
    assert survival([0.9], 0) == []


@pytest.mark.parametrize(
    ("confidences", "caps", "costs", "expected"),
    [
        # rates 1/2, 1.9/2, 2.35/2: verify all (flat target cost).
        ([[0.9, 0.5]], [2], FLAT, 2),
        # rates 1/2, 1.9/4, 2.35/6: verify none (each token costs 2 ms).
        ([[0.9, 0.5]], [2], STEEP, 0),
        # a cap of 0 leaves no slot.
        ([[0.9, 0.5]], [0], FLAT, 0),
        # survivals .9 .81 .5 .25; rates 2/2, 2.9/2.5, 3.71/3, 4.21/3.5, 4.46/4: two.
        ([[0.9, 0.9], [0.5, 0.5]], [2, 2], PAIR, 2),
        # the weak request capped at 0: survivals .9 .81; rates 1, 1.16, 1.2367: two.
        ([[0.9, 0.9], [0.5, 0.5]], [2, 0], PAIR, 2),
    ],
)
def test_step_budget_is_the_argmax_of_tokens_per_ms(
    confidences: list[list[float]], caps: list[int], costs: CostCurves, expected: int
) -> None:
    sampling = len(caps)
    assert step_budget(confidences, caps, costs, sampling, len(caps)) == expected


@pytest.mark.parametrize(
    ("confidences", "caps", "budget", "expected"),
    [
        ([[0.9, 0.9], [0.5, 0.5]], [2, 2], 2, [2, 0]),
        ([[0.9, 0.9], [0.5, 0.5]], [2, 2], 3, [2, 1]),
        # request 0's second slot (.45) loses to request 1's first (.6).
        ([[0.9, 0.5], [0.6, 0.1]], [2, 2], 2, [1, 1]),
        # the cap keeps a confident request's slots out.
        ([[0.99, 0.99], [0.5, 0.5]], [1, 2], 2, [1, 1]),
        ([[0.9, 0.9], [0.5, 0.5]], [2, 2], 0, [0, 0]),
        ([[0.9, 0.9], [0.5, 0.5]], [2, 1], 9, [2, 1]),
    ],
)
def test_assign_budget_admits_the_best_slots_as_prefixes(
    confidences: list[list[float]], caps: list[int], budget: int, expected: list[int]
) -> None:
    assert assign_budget(confidences, caps, budget) == expected


def test_admitted_drafts_sizes_on_the_stale_copy_and_ranks_on_the_current() -> None:
    current = [[0.9, 0.9], [0.5, 0.5]]
    # A newcomer's stale confidences read 1.0 (vLLM `add_request`): a larger budget.
    stale = [[1.0, 1.0], [1.0, 1.0]]
    assert admitted_drafts(current, [2, 2], PAIR, 2, 2) == [2, 0]
    assert admitted_drafts(current, [2, 2], PAIR, 2, 2, budget_confidences=stale) == [2, 2]


@pytest.mark.parametrize(
    ("curve", "limit", "expected"),
    [
        # each size priced at the next profiled one, linear beyond the last two.
        ([(1, 2.0), (4, 3.0)], 6, [2.0, 2.0, 3.0, 3.0, 3.0, 3.0 + 1 / 3, 3.0 + 2 / 3]),
        # made monotone first.
        ([(1, 3.0), (2, 2.0)], 3, [3.0, 3.0, 3.0, 3.0]),
        ([(2, 5.0)], 3, [5.0, 5.0, 5.0, 5.0]),
    ],
)
def test_cost_tables_as_vllm_builds_them_without_graphs(
    curve: list[tuple[int, float]], limit: int, expected: list[float]
) -> None:
    tables = cost_tables(curve, curve, limit, limit)
    assert list(tables.draft_ms) == pytest.approx(expected)
    assert list(tables.verify_ms) == pytest.approx(expected)
    assert tables.step_ms(1, 2) == pytest.approx(expected[1] + expected[2])
