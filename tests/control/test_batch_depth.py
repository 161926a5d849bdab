"""The batch-level rules (`BatchDepth`), table by table, on a calibrated cost model.

Relative step costs at batch 4 are learnt from engine steps of 10 / 15 / 16 / 18 /
24 ms at k = 0..4 (about 1 / 1.49 / 1.60 / 1.80 / 2.39 after the prior's weight:
a CPU's shape, a dear first draft, then small increments, then a jump), and the
hysteresis is 10 %. Each case's expected depth follows from those costs by hand in
its comment; `test_the_costs_are_the_ones_the_tables_assume` pins them.
"""

from __future__ import annotations

import dataclasses

import pytest

from gateway.control.batch_depth import BatchDepth
from gateway.control.batch_load import BatchLoad
from gateway.control.cost_model import CostModel
from gateway.control.decision import LoadSnapshot, SpeculationDecision
from tests.control.test_cost_model import step_calibrated

STEP_MS = (10.0, 15.0, 16.0, 18.0, 24.0)
BUCKET = 4
#: E[tokens | depth d] for a class that gains little (tool calls) or much (chat, code).
FLAT = (1.0, 1.17, 1.2, 1.22, 1.22)
CHAT = (1.0, 1.8, 2.4, 2.9, 3.2)
DEEP = (1.0, 1.95, 2.85, 3.7, 4.8)


def _costs() -> CostModel:
    return step_calibrated(STEP_MS, BUCKET, steps=40)


def _batch() -> BatchDepth:
    return BatchDepth(_costs(), hysteresis=0.1)


def test_the_costs_are_the_ones_the_tables_assume() -> None:
    costs = _costs().relative_costs_in(BUCKET)
    assert costs == pytest.approx((1.0, 1.49, 1.60, 1.80, 2.39), abs=0.01)


def _times(n: int, gains: tuple[float, ...]) -> list[float]:
    return [n * g for g in gains]


@pytest.mark.parametrize(
    ("case", "k", "k_min", "mates", "deepest", "own", "held"),
    [
        # (3 + g_d) / c_d at d = 0..4: 4.0, 3.22, 3.38, 3.27, 2.60.
        (
            "mates at 0 gain nothing from depth: the newcomer stays at 0",
            4,
            0,
            [3.0] * 5,
            0,
            CHAT,
            0,
        ),
        ("the same, bounded below by k_min", 4, 2, [3.0] * 5, 0, CHAT, 2),
        # At 4: 19.2 / 2.39 = 8.03; at 3: 14.8 / 1.80 = 8.22, over 1 + (4.8 - 3.7) / 19.2
        # for what the newcomer gives up while the batch stays at 4: 7.78.
        ("every request gains from depth: the batch stays at 4", 4, 0, _times(3, DEEP), 4, DEEP, 4),
        # Mates at 3 (3 DEEP_d capped at 3): 14.8 / 1.80 = 8.22 at 3; 15.9 / 2.39 = 6.65 at 4.
        (
            "a newcomer does not raise a batch whose mates gain nothing from its depth",
            4,
            0,
            [3.0, 5.85, 8.55, 11.1, 11.1],
            3,
            DEEP,
            3,
        ),
        # Tool calls at 1 (3 FLAT_d capped at 1): 3.56 at 1; 5.91 / 1.60 = 3.69 at 2;
        # 3.56 at 3; 2.81 at 4; 4.0 at 0, over 1 + (1.8 - 1) / 5.31: 3.48.
        (
            "three tool calls at 1: a chat newcomer raises the batch to 2",
            4,
            0,
            [3.0, 3.51, 3.51, 3.51, 3.51],
            1,
            CHAT,
            2,
        ),
        # Tool calls at 4: 6.86 / 2.39 = 2.87 at 4; over the shortfall's share, 3.64 / 1.044
        # = 3.49 at 3, 3.75 / 1.117 = 3.36 at 2, 3.56 / 1.20 = 2.96 at 1, 4.0 / 1.32 = 3.03 at 0.
        (
            "three tool calls at 4: a chat newcomer comes down to 3, not to 0",
            4,
            0,
            _times(3, FLAT),
            4,
            CHAT,
            3,
        ),
        # 2 CHAT_d / c_d: 2.68 at 4; 3.22 / (1 + 0.3 / 6.4) = 3.08 at 3, 3.0 / 1.125 = 2.67 at 2.
        ("a chat pair comes down from 4 to 3", 4, 0, _times(1, CHAT), 4, CHAT, 3),
        ("k = k_min: nothing to choose", 2, 2, [3.0] * 5, 0, CHAT, 2),
    ],
)
def test_held_depth_maximises_the_batch_tokens_per_step_cost(
    case: str,
    k: int,
    k_min: int,
    mates: list[float],
    deepest: int,
    own: tuple[float, ...],
    held: int,
) -> None:
    assert _batch().held(k, k_min, mates, own, BUCKET, deepest)[0] == held, case


def test_held_depth_without_gains_or_costs_for_k_keeps_k() -> None:
    assert _batch().held(4, 0, [3.0] * 5, (1.0, 1.5), BUCKET, 0)[0] == 4


@pytest.mark.parametrize(
    ("case", "guarded", "k", "k_min", "depth"),
    [
        # A guarded tool call yields 1.22 at most: below 0.98 c_d for every d > 0.
        ("a guarded tool call keeps its floor only at k = 0", {(FLAT, 0.98): 1}, 4, 0, 0),
        # Chat yields 3.2 at 4 against 0.98 x 2.39 = 2.34: the batch may go deep.
        ("a guarded chat request bears k = 4", {(CHAT, 0.98): 2}, 4, 0, 4),
        ("every guarded request must keep its floor", {(CHAT, 0.98): 1, (FLAT, 0.98): 1}, 4, 0, 0),
        ("the newcomer's own k_min still binds", {(FLAT, 0.98): 1}, 4, 1, 1),
        # Half its speed at k = 0: 1.22 >= 0.5 x 2.39 = 1.19, so k = 4 too.
        ("a lower floor lets the batch go deeper", {(FLAT, 0.5): 1}, 4, 0, 4),
        # 0.7: 1.22 < 0.7 x 1.80 = 1.26 at 3, 1.2 >= 0.7 x 1.60 = 1.12 at 2.
        ("a floor of 0.7 keeps a tool call's batch at 2", {(FLAT, 0.7): 1}, 4, 0, 2),
        ("no gains known: one token a step, so k = 0", {((), 0.98): 1}, 3, 0, 0),
        ("nobody guarded: k", {}, 3, 0, 3),
    ],
)
def test_floor_is_the_deepest_depth_every_guarded_request_affords(
    case: str, guarded: dict[tuple[tuple[float, ...], float], int], k: int, k_min: int, depth: int
) -> None:
    load = LoadSnapshot(running=3, guarded=guarded)
    assert _batch().floor(load, BUCKET, k, k_min) == depth, case


def test_a_guarded_request_held_at_zero_keeps_newcomers_at_zero() -> None:
    """A chat request held at k = 0 for its batch yields one token a step at any depth
    (it verifies none), so a newcomer that would draft deep beside it is floored to 0;
    running at the k = 4 its class chose, the same request bears k = 4 (3.2 >= 0.98 x
    2.39)."""
    batch = _batch()
    for k, depth in ((0, 0), (4, 4)):
        load = BatchLoad()
        load.enter(k, CHAT, 40, floor=0.98)
        snapshot = LoadSnapshot(running=3, guarded=load.guarded)
        assert batch.floor(snapshot, BUCKET, 4, 0) == depth, k


def _decision(k: int, gains: tuple[float, ...]) -> SpeculationDecision:
    return SpeculationDecision(k, "goodput", False, "c", "chat", BUCKET, gains=gains)


@pytest.mark.parametrize(
    ("case", "k", "gains", "deepest", "cap"),
    [
        # One token a step beside drafts that cost 1.49x or more: only k = 0 keeps 0.98.
        ("a k = 0 tool call lowers a k = 4 batch to 0", 0, (1.0,) * 5, 4, 0),
        # 2.4 tokens at its k = 2 bear steps up to 2.4 / 0.98 = 2.45x: all of k = 4.
        ("a chat request at k = 2 bears the batch's k = 4", 2, CHAT, 4, None),
        # 1.8 tokens at k = 1: up to 1.84x, so k = 3 (1.80) but not 4 (2.39).
        ("a chat request at k = 1 lowers it to 3", 1, CHAT, 4, 3),
        ("a batch no deeper than the request: nothing to lower", 2, CHAT, 2, None),
    ],
)
def test_lower_for_floor_caps_the_batch_where_its_own_tokens_pay(
    case: str, k: int, gains: tuple[float, ...], deepest: int, cap: int | None
) -> None:
    decision = _decision(k, gains)
    lowered = _batch().lower_for_floor(decision, 0.98, BUCKET, deepest)
    assert lowered.batch_cap == cap, case
    assert lowered.k == k
    if cap is None:
        assert lowered is decision
    else:
        assert f"lowers the batch from k={deepest} to k={cap} for its floor" in lowered.reason
        assert dataclasses.replace(lowered, batch_cap=None, reason="goodput") == decision
