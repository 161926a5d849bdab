"""The batch-depth rule (`engine.vllm.batch_depth`): which rule on which platform and graph
mode, and how a step's drafts are spread over its requests under each."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from engine.vllm.batch_depth import (
    FIRST_STEP_KEY,
    POLICY_OVERRIDE_KEY,
    PREFILL_STEP_KEY,
    BatchDepthPolicy,
    DepthRule,
    capture_schedule,
    capture_sizes,
    captured_depths,
    full_batches,
    request_counts,
    rule_for,
    select_policy,
)

PER, UNI = BatchDepthPolicy.PER_REQUEST, BatchDepthPolicy.UNIFORM


@pytest.mark.parametrize(
    ("device", "mode", "eager", "want"),
    [
        ("cpu", "NONE", True, PER),
        ("cpu", "FULL_AND_PIECEWISE", False, PER),  # the CPU keeps its behaviour
        ("cuda", "FULL_AND_PIECEWISE", False, UNI),  # vLLM's CUDA default
        ("cuda", "FULL_DECODE_ONLY", False, UNI),
        ("cuda", "FULL_AND_PIECEWISE", True, PER),  # enforce_eager: no graphs at all
        ("cuda", "PIECEWISE", False, PER),  # attention outside the graph: widths may mix
        ("cuda", "FULL", False, PER),  # one FULL routine for mixed batches too
        ("cuda", "NONE", False, PER),
    ],
)
def test_policy_follows_platform_and_graph_mode(
    device: str, mode: str, eager: bool, want: BatchDepthPolicy
) -> None:
    assert select_policy(device, mode, eager) is want


@pytest.mark.parametrize(
    ("schedule", "v2", "want"),
    [
        ((), True, (4,)),
        ((4, 3, 1, 0), True, (1, 3, 4)),  # V2 captures the schedule's widths (not 0)
        ((4, 3, 1), False, (4,)),  # V1's dispatcher knows 1 + K only
        ((9, 2), True, (2, 4)),  # nothing above K
    ],
)
def test_captured_depths(schedule: tuple[int, ...], v2: bool, want: tuple[int, ...]) -> None:
    assert captured_depths(4, schedule, v2) == want


@pytest.mark.parametrize(
    ("wanted", "per_request", "uniform"),
    [
        ([], 0, 0),
        ([0, 0], 0, 0),  # a k = 0 batch asks the drafter for nothing either way
        ([1, 2], 2, 3),  # uniform: rounded up to a captured depth (1, 3, 4)
        ([1], 1, 1),
        ([0, 4, 2], 4, 4),
        ([2, 2], 2, 3),
    ],
)
def test_step_depth(wanted: list[int], per_request: int, uniform: int) -> None:
    assert DepthRule(PER, 4, (4,)).step_depth(wanted) == per_request
    assert DepthRule(UNI, 4, (1, 3, 4)).step_depth(wanted) == uniform


@pytest.mark.parametrize(
    ("k", "step", "per_request", "uniform"),
    [(0, 3, 0, 0), (1, 3, 1, 3), (3, 3, 3, 3), (4, 3, 3, 3), (2, 0, 0, 0)],
)
def test_drafts_for_a_request(k: int, step: int, per_request: int, uniform: int) -> None:
    """Uniform: every drafting request verifies the step's depth; k = 0 verifies none."""
    assert DepthRule(PER, 4).drafts_for(k, step) == per_request
    assert DepthRule(UNI, 4, (4,)).drafts_for(k, step) == uniform


@pytest.mark.parametrize(
    ("step", "captured", "per_request", "uniform"),
    [
        (0, (4,), 0, 0),  # a batch of k = 0 prefills drafts nothing
        (1, (4,), 1, 1),
        (4, (4,), 1, 4),  # only K has a FULL graph: the next step keeps it
        (4, (2, 4), 1, 2),  # the shallowest captured depth
        (3, (1, 3, 4), 1, 1),
    ],
)
def test_a_prefill_only_step_asks_for_one_draft(
    step: int, captured: tuple[int, ...], per_request: int, uniform: int
) -> None:
    assert DepthRule(PER, 4, captured).first_step_depth(step) == per_request
    assert DepthRule(UNI, 4, captured).first_step_depth(step) == uniform
    assert DepthRule(PER, 4, captured, None).first_step_depth(step) == step  # cap off


@pytest.mark.parametrize(
    ("cap", "step", "per_request", "uniform"),
    [(None, 4, 4, 4), (1, 4, 1, 2), (1, 1, 1, 1), (2, 4, 2, 2), (3, 4, 3, 4)],
)
def test_a_prefill_step_cap(cap: int | None, step: int, per_request: int, uniform: int) -> None:
    """Off by default; on, the cap (per request) or the shallowest captured width at or
    above it (uniform: captured 2 and 4 here)."""
    captured = (2, 4)
    assert DepthRule(PER, 4, captured).prefill_step_depth(step) == step
    assert DepthRule(PER, 4, captured, 1, cap).prefill_step_depth(step) == per_request
    assert DepthRule(UNI, 4, captured, 1, cap).prefill_step_depth(step) == uniform


def test_the_prefill_step_cap_from_the_config() -> None:
    assert rule_for(_config("NONE"), "cpu").prefill_step_cap is None
    assert rule_for(_config("NONE", extra={PREFILL_STEP_KEY: 1}), "cpu").prefill_step_cap == 1


def test_the_first_step_cap_from_the_config() -> None:
    assert rule_for(_config("NONE"), "cpu").first_step_cap == 1
    assert rule_for(_config("NONE", extra={FIRST_STEP_KEY: None}), "cpu").first_step_cap is None
    assert rule_for(_config("NONE", extra={FIRST_STEP_KEY: 2}), "cpu").first_step_cap == 2


def test_a_mixed_step_is_only_counted_under_the_uniform_rule() -> None:
    assert DepthRule(UNI, 4, (4,)).is_mixed([0, 2])
    assert not DepthRule(UNI, 4, (4,)).is_mixed([1, 2])
    assert not DepthRule(UNI, 4, (4,)).is_mixed([0, 0])
    assert not DepthRule(PER, 4).is_mixed([0, 2])


def _config(mode: str, eager: bool = False, extra: dict[str, object] | None = None) -> object:
    """The attributes `rule_for` reads of vLLM's `VllmConfig`, nothing else."""
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=4),
        compilation_config=SimpleNamespace(cudagraph_mode=SimpleNamespace(name=mode)),
        model_config=SimpleNamespace(enforce_eager=eager),
        additional_config=extra or {},
        use_v2_model_runner=True,
    )


def test_rule_for_a_resolved_config() -> None:
    cuda = rule_for(_config("FULL_AND_PIECEWISE"), "cuda", {2, 4})
    assert cuda == DepthRule(UNI, 4, (2, 4), zero_skips_drafter=False)  # V2 drafts each step
    v1 = _config("FULL_AND_PIECEWISE")
    v1.use_v2_model_runner = False  # type: ignore[attr-defined]
    assert rule_for(v1, "cuda").zero_skips_drafter  # the V1 runner skips it at depth 0
    assert rule_for(_config("FULL_AND_PIECEWISE"), "cpu").policy is PER
    forced = rule_for(_config("NONE", extra={POLICY_OVERRIDE_KEY: "uniform"}), "cpu")
    assert forced.policy is UNI


def test_an_unknown_forced_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="sometimes"):
        rule_for(_config("NONE", extra={POLICY_OVERRIDE_KEY: "sometimes"}), "cuda")


def test_the_capture_schedule_holds_every_depth_and_starts_at_batch_one() -> None:
    """V2 captures width 1 + k for each k the schedule holds (width 1 too): all of 0..K."""
    rows = capture_schedule(4, 256)
    assert rows[0][:2] == [1, 1]
    assert rows[-1][1] == 256
    assert sorted(k for _, _, k in rows) == [0, 1, 2, 3, 4]
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(rows))


def test_capture_sizes_give_every_width_batches_up_to_the_ceiling() -> None:
    sizes = capture_sizes(4, 256, 512)
    assert max(sizes) <= 512
    batches = full_batches(range(5), sizes, 256)
    # Width 1 (k = 0) and 2 (k = 1) reach vLLM's request grid's 256; wider ones stop
    # where the next grid count would pass 512 tokens.
    assert batches == {0: 256, 1: 256, 2: 168, 3: 128, 4: 96}
    assert request_counts(256)[:5] == [1, 2, 4, 8, 16]


def test_without_the_capture_sizes_only_the_default_ones_count() -> None:
    """vLLM's own grid at K = 4 without a schedule: width 5 at 1..102 requests."""
    default = [n * 5 for n in request_counts(256) if n * 5 <= 512]
    assert full_batches([4], default, 256) == {4: 96}


def test_a_depth_whose_graphs_stop_below_the_batch_is_not_rounded_up_to() -> None:
    """The rule rounds a step's depth up only to a width captured at the step's batch
    size (vLLM captures up to 512 tokens: K = 4 stops at 96 requests here)."""
    rule = DepthRule(UNI, 4, (1, 2, 3, 4), full_batch={1: 256, 2: 168, 3: 128, 4: 96})
    assert rule.captured_at(8) == (1, 2, 3, 4)
    assert rule.captured_at(120) == (1, 2, 3)
    assert rule.step_depth([1] * 8) == 1
    assert rule.step_depth([4] * 120) == 4  # no width 5 graph at 120: its own depth
    assert rule.step_depth([3] * 200) == 3  # none of width 4 either
    assert rule.step_depth([1, 2] * 100) == 2
    assert DepthRule(UNI, 4, (4,)).captured_at(10_000) == (4,)  # no ceiling known


def test_rule_for_reads_the_capture_ceiling_of_the_resolved_config() -> None:
    config = _config("FULL_AND_PIECEWISE")
    config.compilation_config.cudagraph_capture_sizes = capture_sizes(4, 64, 512)  # type: ignore[attr-defined]
    config.scheduler_config = SimpleNamespace(max_num_seqs=64)  # type: ignore[attr-defined]
    rule = rule_for(config, "cuda", {0, 1, 2, 3, 4})
    assert rule.captured == (1, 2, 3, 4)
    assert rule.full_batch == {1: 64, 2: 64, 3: 64, 4: 64}
