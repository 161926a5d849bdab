"""A finished vLLM `RequestOutput` -> the control plane's `RequestOutcome`.

How vLLM counts (vllm 0.32, `Scheduler.update_from_output`): a verify step is
recorded for a request only in a step where drafts were *scheduled* for it and
it sampled tokens; it adds `num_draft_tokens` (less grammar-invalidated ones)
and one histogram entry at j = accepted drafts. A request whose drafts were
capped to 0 by `engine.vllm.scheduler` has no drafts scheduled, so it records no
step at all: draft tokens 0, histogram empty, acceptance length 1.0 (vLLM's
definition, 1 + accepted / steps, with 1.0 for no steps). The engine's
Prometheus counters (`vllm:spec_decode_num_draft_tokens_total`, ...) are fed
from the same per-step numbers, which is why per-request sums equal their deltas. The
outcome keeps vLLM's histogram and per-step lists too, so the response's
`metrics.speculative_decoding` block can be written from it where vLLM writes none
(`engine.spec_decode_report`).

Timings come from `RequestOutput.metrics` (`RequestStateStats`): engine-core
timestamps for first and last token, and the frontend's first-token latency.
"""

from __future__ import annotations

from typing import Any

from engine.interface import RequestOutcome, SpeculationOutcome, token_steps


def speculation_outcome(k: int, metrics: Any | None) -> SpeculationOutcome:
    """From a `RequestSpecDecodeMetrics` (None = no verify step happened)."""
    if metrics is None:
        return SpeculationOutcome(k=k)
    histogram: list[int] = list(metrics.histogram)
    steps = sum(histogram)
    accepted = sum(j * count for j, count in enumerate(histogram))
    # Position d+1 was accepted in every step that accepted more than d drafts
    # (acceptance is a prefix), so accepted_per_position is a suffix sum.
    depth = max(len(histogram) - 1, 0)
    accepted_per_position = tuple(sum(histogram[d + 1 :]) for d in range(depth))
    drafted: list[int] = list(getattr(metrics, "per_step_drafted", []) or [])
    drafted_per_position = (
        tuple(sum(1 for n in drafted if n > d) for d in range(depth)) if drafted else ()
    )
    # Position d+1 was tried in a step that drafted past d and accepted positions 1..d:
    # the joint count, which the two marginals cannot give once steps differ in depth.
    per_step_accepted: list[int] = list(getattr(metrics, "per_step_accepted", []) or [])
    tried_per_position = (
        tuple(
            sum(1 for n, a in zip(drafted, per_step_accepted, strict=True) if n > d and a >= d)
            for d in range(depth)
        )
        if drafted and len(per_step_accepted) == len(drafted)
        else ()
    )
    # Positions beyond k are structurally zero for a request capped at k, unless a step
    # verified it deeper (the uniform rule on CUDA: every drafting request verifies the
    # step's depth, `engine.vllm.batch_depth`): those positions are evidence too.
    depth_seen = max(k, max(drafted, default=0))
    return SpeculationOutcome(
        k=k,
        verify_steps=steps,
        draft_tokens=int(metrics.num_draft_tokens),
        accepted_tokens=accepted,
        accepted_per_position=_trim(accepted_per_position, depth_seen),
        drafted_per_position=_trim(drafted_per_position, depth_seen),
        tried_per_position=_trim(tried_per_position, depth_seen),
        acceptance_histogram=tuple(histogram),
        per_step_accepted=tuple(per_step_accepted),
        per_step_drafted=tuple(drafted),
    )


def _trim(per_position: tuple[int, ...], depth: int) -> tuple[int, ...]:
    return per_position[:depth] if len(per_position) > depth else per_position


def timings(stats: Any | None, output_tokens: int) -> tuple[float, float, float]:
    """(ttft_s, tpot_s, e2e_s) from `RequestStateStats`; zeros when stats are off."""
    if stats is None or not getattr(stats, "first_token_ts", 0.0):
        return 0.0, 0.0, 0.0
    ttft = float(stats.first_token_latency)
    decode_span = max(float(stats.last_token_ts) - float(stats.first_token_ts), 0.0)
    tpot = decode_span / (output_tokens - 1) if output_tokens > 1 else 0.0
    return ttft, tpot, ttft + decode_span


def request_outcome(
    request_id: str,
    output: Any,
    *,
    k: int,
    output_tokens: int | None = None,
) -> RequestOutcome:
    """Build the outcome from the final `RequestOutput` of one (n = 1) request.

    `output_tokens` must be given when the output was streamed in DELTA mode
    (the final output then holds only the last increment of token ids).
    """
    completion = output.outputs[0] if output.outputs else None
    n_out = (
        output_tokens
        if output_tokens is not None
        else (len(completion.token_ids) if completion else 0)
    )
    spec = speculation_outcome(k, completion.spec_decode_metrics if completion else None)
    ttft, tpot, e2e = timings(output.metrics, n_out)
    return RequestOutcome(
        request_id=request_id,
        prompt_tokens=len(output.prompt_token_ids or ()),
        output_tokens=n_out,
        finish_reason=completion.finish_reason if completion else None,
        speculation=spec,
        ttft_s=ttft,
        tpot_s=tpot,
        e2e_s=e2e,
        decode_steps=token_steps(n_out, spec.verify_steps, spec.accepted_tokens),
        cached_prompt_tokens=int(getattr(output, "num_cached_tokens", None) or 0),
    )
