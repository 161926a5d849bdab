"""vLLM's per-request metrics -> `RequestOutcome`, on vLLM's own value objects (no engine).

What the controller needs: k, verify steps, drafted and accepted tokens, accepted
count per draft position, acceptance length (1 + accepted / steps), TTFT and TPOT.
"""

from __future__ import annotations

import pytest
from vllm.outputs import CompletionOutput, RequestOutput
from vllm.v1.metrics.stats import RequestSpecDecodeMetrics, RequestStateStats

from engine.interface import token_steps
from engine.protocol import SpeculativeDecodingMetrics
from engine.spec_decode_report import speculative_decoding
from engine.vllm.outcome import request_outcome, speculation_outcome


@pytest.mark.parametrize(
    ("k", "histogram", "drafted", "accepted", "per_position", "drafted_per_position"),
    [
        # 6 steps at k = 3: accepted 0,0,1,2,2,2 drafts -> 7; position d accepted when j > d.
        (3, [2, 1, 3, 0], [3] * 6, 7, (4, 3, 0), (6, 6, 6)),
        # k = 1 on a K = 3 engine: positions past k are cut, not reported as zeros.
        (1, [5, 3, 0, 0], [1] * 8, 3, (3,), (8,)),
        # `summary` metrics: no per-step lists, so no drafted-per-position.
        (2, [1, 1, 2], [], 5, (3, 2), ()),
    ],
)
def test_speculation_outcome_table(
    k: int,
    histogram: list[int],
    drafted: list[int],
    accepted: int,
    per_position: tuple[int, ...],
    drafted_per_position: tuple[int, ...],
) -> None:
    metrics = RequestSpecDecodeMetrics(
        num_spec_tokens=len(histogram) - 1,
        histogram=histogram,
        num_draft_tokens=k * sum(histogram),
        per_step_drafted=drafted,
    )
    spec = speculation_outcome(k, metrics)
    assert spec.verify_steps == sum(histogram)
    assert spec.draft_tokens == k * sum(histogram)
    assert spec.accepted_tokens == accepted == sum(spec.accepted_per_position)
    assert spec.accepted_per_position == per_position
    assert spec.drafted_per_position == drafted_per_position
    assert spec.acceptance_length == pytest.approx(1 + accepted / sum(histogram))


def test_no_verify_step_is_acceptance_length_one() -> None:
    spec = speculation_outcome(0, None)
    assert (spec.k, spec.verify_steps, spec.draft_tokens, spec.acceptance_length) == (0, 0, 0, 1.0)


def _finished(
    metrics: RequestSpecDecodeMetrics, stats: RequestStateStats | None = None
) -> RequestOutput:
    """A finished one-completion output (3 prompt tokens, cut by max_tokens)."""
    completion = CompletionOutput(
        index=0,
        text="",
        token_ids=[1],
        cumulative_logprob=None,
        logprobs=None,
        finish_reason="length",
        spec_decode_metrics=metrics,
    )
    return RequestOutput("r", None, [1, 2, 3], None, [completion], True, metrics=stats)


def test_request_outcome_timings_and_decode_steps() -> None:
    stats = RequestStateStats(first_token_ts=10.0, last_token_ts=10.9, first_token_latency=0.2)
    metrics = RequestSpecDecodeMetrics(num_spec_tokens=2, histogram=[1, 2, 3], num_draft_tokens=12)
    outcome = request_outcome("gw-1", _finished(metrics, stats), k=2, output_tokens=19)
    assert (outcome.request_id, outcome.prompt_tokens, outcome.output_tokens) == ("gw-1", 3, 19)
    assert outcome.finish_reason == "length"
    assert outcome.ttft_s == pytest.approx(0.2)
    assert outcome.tpot_s == pytest.approx(0.9 / 18)
    assert outcome.e2e_s == pytest.approx(1.1)
    # 6 verify steps gave 6 + 8 accepted tokens; the other 5 came one per plain step.
    assert outcome.speculation.accepted_tokens == 8
    assert outcome.decode_steps == 6 + 5


def test_decode_steps_count_the_prefills_step_when_the_last_verify_step_was_cut() -> None:
    # 3 verify steps of 2 accepted drafts each would give 1 + 3 + 6 = 10 tokens; max_tokens
    # cut the last at 8: the steps are still the prefill's and the 3 verify steps.
    metrics = RequestSpecDecodeMetrics(num_spec_tokens=2, histogram=[0, 0, 3], num_draft_tokens=6)
    outcome = request_outcome("gw-1", _finished(metrics), k=2, output_tokens=8)
    assert outcome.decode_steps == 1 + 3
    assert token_steps(8, 0, 0) == 8
    assert token_steps(0, 0, 0) == 0


def test_tried_per_position_is_the_joint_count_of_steps_of_different_depths() -> None:
    """A one-draft first step, then steps at k = 3 (`detailed` metrics): position 2 was
    tried only in steps that drafted it and accepted position 1."""
    drafted = [1, 3, 3, 3, 3]
    accepted = [1, 3, 0, 1, 2]
    metrics = RequestSpecDecodeMetrics(
        num_spec_tokens=3,
        histogram=[1, 2, 1, 1],
        num_draft_tokens=sum(drafted),
        per_step_accepted=accepted,
        per_step_drafted=drafted,
    )
    spec = speculation_outcome(3, metrics)
    assert spec.accepted_per_position == (4, 2, 1)
    assert spec.drafted_per_position == (5, 4, 4)
    # Position 2: steps 2, 4, 5 (drafted 3, accepted >= 1); position 3: steps 2, 5.
    assert spec.tried_per_position == (5, 3, 2)


def test_summary_metrics_have_no_joint_count() -> None:
    metrics = RequestSpecDecodeMetrics(num_spec_tokens=2, histogram=[1, 1, 2], num_draft_tokens=8)
    assert speculation_outcome(2, metrics).tried_per_position == ()


def test_a_request_verified_deeper_than_its_k_reports_those_positions() -> None:
    """The uniform rule (CUDA FULL graphs): a request at k = 1 in steps at depth 3 verified
    three drafts a step; the positions past its k are reported, not cut."""
    metrics = RequestSpecDecodeMetrics(
        num_spec_tokens=4,
        histogram=[1, 0, 1, 1, 0],
        num_draft_tokens=9,
        per_step_accepted=[3, 0, 2],
        per_step_drafted=[3, 3, 3],
    )
    spec = speculation_outcome(1, metrics)
    assert spec.accepted_per_position == (2, 2, 1)
    assert spec.drafted_per_position == (3, 3, 3)
    assert spec.tried_per_position == (3, 2, 2)


@pytest.mark.parametrize(
    "metrics",
    [
        RequestSpecDecodeMetrics(num_spec_tokens=2, histogram=[1, 1, 2], num_draft_tokens=8),
        RequestSpecDecodeMetrics(
            num_spec_tokens=4,
            histogram=[1, 0, 1, 1, 0],
            num_draft_tokens=9,
            per_step_accepted=[3, 0, 2],
            per_step_drafted=[3, 3, 3],
        ),
        RequestSpecDecodeMetrics.new(3),  # a k = 0 request: no verify step
    ],
    ids=["summary", "detailed", "no-step"],
)
def test_the_response_block_from_the_outcome_is_vllms_own(
    metrics: RequestSpecDecodeMetrics,
) -> None:
    """Where vLLM's serving writes no `metrics.speculative_decoding` (its Responses API),
    the block written from the outcome is the one vLLM writes for chat, to the bit."""
    block = speculative_decoding(speculation_outcome(1, metrics))
    assert block == metrics.to_dict()
    assert block is not None
    SpeculativeDecodingMetrics.model_validate(block)


def test_an_engine_without_spec_decode_metrics_has_no_block() -> None:
    assert speculative_decoding(speculation_outcome(0, None)) is None
