"""The baseline modes' rules, table-driven, and the oracle's and the bound's choices."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from bench.twin.costs import StepCosts
from bench.twin.engine import Plan
from bench.twin.modes.oracle import choose, static_depth
from bench.twin.modes.sglang import EmaTiers, TierSlot
from bench.twin.modes.trtllm import AcceptanceGate, break_even_rate
from bench.twin.modes.upper_bound import Clairvoyant
from bench.twin.modes.vllm_schedule import depth_table, mix_marginals, ranges
from bench.twin.records import RequestRecord, RunResult
from bench.twin.schema import Profile, Workload


def _costs(spec: list[list[float]], k_max: int) -> StepCosts:
    rows = tuple(tuple(r) for r in [spec[0], *spec])  # index 0 unused, as the engine's
    return StepCosts(k_max, rows, tuple(r[0] for r in rows), 0.0, 0.0, (0.0,) * (k_max + 1))


# ---- SGLang -------------------------------------------------------------------------------


def _feed(slot: TierSlot, value: float, times: int) -> TierSlot:
    for _ in range(times):
        slot.update(value)
    return slot


def test_sglang_slot_waits_for_warmup_then_climbs_to_round_ema_plus_one() -> None:
    slot = TierSlot.start((1, 3, 5, 7), -0.25, 0.0, 3)
    assert slot.ema == 2.0
    assert _feed(slot, 6.0, 10).current == 3  # warm-up: no switch
    assert _feed(slot, 6.0, 4).current == 3  # not yet at the update interval
    assert _feed(slot, 6.0, 1).current == 7  # ema 5.86 > 3 - 0.5 and > 5 - 0.5: two tiers up


def test_sglang_slot_drops_with_hysteresis_and_a_zero_tier_probes_up() -> None:
    slot = _feed(TierSlot.start((1, 3, 5, 7), -0.25, 0.0, 3), 0.0, 40)
    assert slot.current == 1  # no zero tier at batch 1
    loaded = _feed(TierSlot.start((0, 1, 3), 0.0, 0.0, 3), 0.0, 15)
    assert loaded.current == 0
    assert _feed(loaded, 0.0, 5).current == 1  # at 0 the next update probes the next tier


@pytest.mark.parametrize(
    ("batch", "tiers"), [(1, (1, 3, 4)), (7, (1, 3, 4)), (8, (0, 1, 3)), (40, (0, 1)), (64, (0,))]
)
def test_sglang_routes_batch_sizes_to_lower_bound_slots_capped_at_k(
    batch: int, tiers: tuple[int, ...]
) -> None:
    assert EmaTiers(max_k=4).slot(batch).tiers == tiers


# ---- TensorRT-LLM ---------------------------------------------------------------------------


def test_trtllm_gate_trips_once_the_rolling_rate_falls_below_and_stays_off() -> None:
    gate = AcceptanceGate(k=3, threshold=0.5, window=4)
    for accepted in (3, 3, 0, 0):  # rates 1, 1, 0, 0: mean 0.5, not below
        gate.verified(batch=1, depth=3, accepted=accepted)
    assert not gate.disabled
    gate.verified(batch=1, depth=3, accepted=0)  # window 1, 0, 0, 0: 0.25
    assert gate.disabled
    assert gate.tripped_at == 5
    assert gate.step_depth(4) == 0
    assert not gate.prefills_drafter(3)
    gate.verified(batch=1, depth=3, accepted=3)
    assert gate.disabled


def test_trtllm_threshold_is_break_even_at_batch_one() -> None:
    profile = Profile.model_validate(
        {
            "name": "p",
            "source": "s",
            "max_k": 3,
            "batch_stats": {"1": {"0": 10.0, "3": 16.0}},
            "no_spec_step_ms": {"1": 8.0},
            "prefill_ms_per_token": {"target": 0.0, "drafter": 0.0},
        }
    )
    rate = break_even_rate(profile, 3)
    assert (1 + 3 * rate) / 16.0 == pytest.approx(1 / 8.0)


# ---- vLLM batch-size schedule ---------------------------------------------------------------


def test_vllm_schedule_maximises_expected_tokens_per_step_cost() -> None:
    # batch 1: drafts cheap (tokens 1, 1.8, 2.4 over 10, 11, 12 ms: k = 2);
    # batch 2: drafts dear (over 10, 20, 30 ms: k = 0).
    costs = _costs([[10.0, 11.0, 12.0], [10.0, 20.0, 30.0]], 2)
    table = depth_table(costs, [0.8, 0.6])
    assert table[1:] == (2, 0)
    assert ranges(table) == [[1, 1, 2], [2, 2, 0]]


def test_mix_marginals_weight_classes_by_their_share_of_the_run() -> None:
    workload = Workload.model_validate(
        {
            "name": "w",
            "source": "s",
            "classes": {
                name: {
                    "request": {"messages": [{"role": "user", "content": name}]},
                    "acceptance": [p],
                    "prompt_tokens": {"dist": "fixed", "value": 10},
                    "output_tokens": {"dist": "fixed", "value": 10},
                }
                for name, p in (("a", 0.8), ("b", 0.4))
            },
            "phases": [
                {"name": "x", "requests": 30, "mix": {"a": 1.0}},
                {"name": "y", "requests": 10, "mix": {"b": 1.0}},
            ],
            "arrivals": [{"kind": "closed", "concurrency": 1}],
        }
    )
    assert mix_marginals(workload, 2) == pytest.approx([0.7, 0.8**2 * 0.75 + 0.4**2 * 0.25])


# ---- the clairvoyant bound ----------------------------------------------------------------


@dataclass
class _Live:
    """What the bound reads of a request in the engine (`bench.twin.engine.LiveRequest`)."""

    runs: bytes
    pos: int
    out: int
    plan: Plan = field(default_factory=lambda: Plan(0))


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ([0, 0, 0, 0], 0),  # nothing to accept: k = 0 is cheapest
        ([4, 4, 4, 4], 4),  # all accept 4: 20 tokens in 22 ms beat 4 in 10
        ([4, 0, 0, 0], 0),  # one accepts: (4 + D) / (10 + 3 D) is largest at D = 0
        ([2, 2, 0, 0], 2),  # 8 tokens in 16 ms beat 4 in 10 and 6 in 13
    ],
)
def test_clairvoyant_picks_the_depth_of_most_tokens_per_second(
    runs: list[int], expected: int
) -> None:
    costs = _costs([[6.0, 8.0, 10.0, 12.0, 14.0]] * 3 + [[10.0, 13.0, 16.0, 19.0, 22.0]], 4)
    lives = [_Live(bytes([r]), 0, 100) for r in runs]
    assert Clairvoyant(costs).step_depth(4, lives) == expected


def test_clairvoyant_counts_no_drafts_past_a_requests_last_token() -> None:
    # Two tokens left: a second draft would be accepted but not emitted, so D = 1
    # (2 tokens in 12 ms), not D = 2 (3 tokens in 14 ms were it not cut).
    costs = _costs([[10.0, 12.0, 14.0]], 2)
    assert Clairvoyant(costs).step_depth(1, [_Live(bytes([2]), 0, 2)]) == 1


# ---- the oracle -----------------------------------------------------------------------------


def _records(speeds: dict[tuple[int, int], float]) -> RunResult:
    """One request per (class, phase), 100 tokens, its latency set to give `speed`."""
    records = [
        RequestRecord(i, c, p, p, 0.0, 0.0, 100 / s, 100, 0, 0, 0, 0, 0)
        for i, ((c, p), s) in enumerate(sorted(speeds.items()))
    ]
    return RunResult(records, 1.0, 1)


def test_oracle_takes_each_class_and_phase_at_its_fastest_static_depth() -> None:
    results = {
        "nospec": _records({(0, 0): 10.0, (1, 0): 20.0, (0, 1): 10.0}),
        "static-k0": _records({(0, 0): 9.0, (1, 0): 19.0, (0, 1): 10.0}),
        "static-k1": _records({(0, 0): 12.0, (1, 0): 18.0, (0, 1): 10.0}),
        "static-k2": _records({(0, 0): 11.0, (1, 0): 25.0, (0, 1): 10.0}),
        "adaptive": _records({(0, 0): 99.0, (1, 0): 99.0, (0, 1): 99.0}),
    }
    assert choose(results) == {(0, 0): 1, (1, 0): 2, (0, 1): 0}  # ties to the shallower


@pytest.mark.parametrize(
    ("mode", "depth"),
    [("nospec", 0), ("static-k0", 0), ("static-k7", 7), ("adaptive", None), ("static-kx", None)],
)
def test_static_depth_of_mode_names(mode: str, depth: int | None) -> None:
    assert static_depth(mode) == depth
