"""vLLM's per-request `metrics.speculative_decoding` block, from a `SpeculationOutcome`.

The block's shape and formulas are vLLM 0.32's (`RequestSpecDecodeMetrics.to_dict` in
`vllm/v1/metrics/stats.py`, the model `SpeculativeDecodingMetrics`):

* `acceptance_histogram[j]`: verify steps that accepted exactly j drafts, j = 0 .. K,
  bonus token excluded; `num_spec_tokens` = K, the engine's configured depth;
* `mean_acceptance_length` = 1 + accepted / steps (1.0 with no step);
  `draft_acceptance_rate` = accepted / drafted (0.0 with no draft);
* `per_step_accepted` / `per_step_drafted` only where the engine recorded them (vLLM's
  `detailed` level).

The fake backend writes its replies' block with it, and the gateway the block of an
answer whose serving layer writes none (vLLM's Responses API).
"""

from __future__ import annotations

from typing import Any

from engine.interface import SpeculationOutcome

#: The per-step lists of the block, present at vLLM's `detailed` level only.
PER_STEP_KEYS = ("per_step_accepted", "per_step_drafted")


def speculative_decoding(spec: SpeculationOutcome) -> dict[str, Any] | None:
    """The block, or None where vLLM writes none (an engine without a drafter)."""
    histogram = list(spec.acceptance_histogram)
    if len(histogram) < 2:
        return None
    steps = sum(histogram)
    accepted = sum(j * count for j, count in enumerate(histogram))
    drafted = spec.draft_tokens
    block: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": len(histogram) - 1,
    }
    if spec.per_step_accepted:
        block[PER_STEP_KEYS[0]] = list(spec.per_step_accepted)
        block[PER_STEP_KEYS[1]] = list(spec.per_step_drafted)
    return block
