"""The batch-depth rule (`engine.vllm.batch_depth`): which rule on which platform and graph
mode, and how a step's drafts are spread over its requests under each."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.vllm.batch_depth import (
    FIRST_STEP_KEY,
    POLICY_OVERRIDE_KEY,
    PREFILL_STEP_KEY,
    BatchDepthPolicy,
    DepthRule,
    captured_depths,
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
