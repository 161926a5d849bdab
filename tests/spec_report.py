"""Checks of one answer's speculation report, shared by the unit and real-engine tiers.

A report is vLLM's `metrics.speculative_decoding` block, valid under vLLM's own model
and consistent in itself, and beside it the gateway's `speculation` object with the
decision only (`gateway.speculation_report`): no count appears twice.
"""

from __future__ import annotations

from typing import Any

import pytest

from engine.protocol import SpeculativeDecodingMetrics

#: What the gateway adds; vLLM's block has the counts.
DECISION_KEYS = {"class", "class_id", "k", "reason"}
PER_STEP_KEYS = {"per_step_accepted", "per_step_drafted"}


def vllm_block(extra: dict[str, Any], *, detailed: bool = False) -> dict[str, Any]:
    """vLLM's block of a body (or a stream's usage chunk), checked; per-step lists iff
    `detailed`."""
    block: dict[str, Any] = extra["metrics"]["speculative_decoding"]
    SpeculativeDecodingMetrics.model_validate(block)
    assert (set(block) >= PER_STEP_KEYS) is detailed, sorted(block)
    histogram = block["acceptance_histogram"]
    steps, accepted = block["num_spec_steps"], block["num_accepted_draft_tokens"]
    assert len(histogram) == block["num_spec_tokens"] + 1
    assert sum(histogram) == steps
    assert sum(j * count for j, count in enumerate(histogram)) == accepted
    assert accepted <= block["num_draft_tokens"] <= block["num_spec_tokens"] * steps
    expected = 1 + accepted / steps if steps else 1.0
    assert block["mean_acceptance_length"] == pytest.approx(expected)
    if detailed:
        assert len(block["per_step_accepted"]) == len(block["per_step_drafted"]) == steps
        assert sum(block["per_step_accepted"]) == accepted
        assert sum(block["per_step_drafted"]) == block["num_draft_tokens"]
    return block


def check_report(
    extra: dict[str, Any] | None, k: int, label: str, *, detailed: bool = False
) -> dict[str, Any]:
    """One report, agreeing with the `x-specgw-k` / `x-specgw-class` headers; vLLM's
    block is returned."""
    assert extra is not None
    spec = extra["speculation"]
    assert set(spec) == DECISION_KEYS, spec
    assert (spec["k"], spec["class"]) == (k, label)
    assert spec["class_id"]
    assert spec["reason"]
    block = vllm_block(extra, detailed=detailed)
    assert block["num_draft_tokens"] <= k * block["num_spec_steps"]
    return block


def no_report(extra: dict[str, Any] | None) -> None:
    """The report switched off: neither the gateway's object nor vLLM's block."""
    extra = extra or {}
    assert "speculation" not in extra
    assert "speculative_decoding" not in (extra.get("metrics") or {})
