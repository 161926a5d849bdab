"""The uniform batch-depth rule on vLLM 0.33's `AsyncScheduler` (what CUDA runs), driven
step by step without a model: every drafting request verifies the step's depth, k = 0
requests none, a mixed step is counted, and the placeholder list vLLM shares between
requests is never cut in place."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from engine.interface import SPEC_DEPTH_ARG
from engine.step_rule import SPEC_COSTS_ARG, SPEC_VOTE_ARG, StepCostTable, StepVote, vote_step_depth
from engine.vllm.batch_depth import (
    CAPTURE_SCHEDULE_KEY,
    POLICY_OVERRIDE_KEY,
    BatchDepthPolicy,
    capture_schedule,
)
from engine.vllm.draft_skip import DRAFTER_IDLE
from engine.vllm.scheduler import AsyncSpecDepthScheduler, AutoSpecDepthScheduler
from tools.model.testing_models import TinyModels

K = 4
BLOCK = 16


def _scheduler(
    tiny: TinyModels,
    policy: str,
    schedule: list[list[int]] | None = None,
    extra: dict[str, Any] | None = None,
) -> Any:
    spec: dict[str, Any] = {
        "method": "eagle3",
        "model": str(tiny.drafter),
        "num_speculative_tokens": K,
    }
    if schedule is not None:
        spec["num_speculative_tokens_per_batch_size"] = schedule
    config = EngineArgs(
        model=str(tiny.target),
        speculative_config=spec,
        max_model_len=512,
        max_num_seqs=16,
        enforce_eager=True,
        dtype="float32",
        enable_prefix_caching=False,
        additional_config={POLICY_OVERRIDE_KEY: policy, **(extra or {})},
    ).create_engine_config()
    config.cache_config.num_gpu_blocks = 1000
    config.scheduler_config.async_scheduling = True  # as vLLM resolves it on CUDA
    layer = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=32, dtype=torch.float32)
    kv = KVCacheConfig(
        num_blocks=1000, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], layer)]
    )
    return AutoSpecDepthScheduler(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
        log_stats=True,
    )


def _request(rid: str, k: int) -> Request:
    params = SamplingParams(max_tokens=40, temperature=0.0, extra_args={SPEC_DEPTH_ARG: k})
    return Request(rid, list(range(10, 30)), params, None)


def _step(sched: Any, outputs: list[Any] | None = None) -> dict[str, int]:
    """One async step: schedule, the drafts come back in the output, accept them all
    (each step's `SchedulerOutput` appended to `outputs`)."""
    out = sched.schedule()
    if outputs is not None:
        outputs.append(out)
    drafts = {
        rid: len(out.scheduled_spec_decode_tokens.get(rid, [])) for rid in out.num_scheduled_tokens
    }
    req_ids = list(out.num_scheduled_tokens)
    proposed = DraftTokenIds(req_ids, [[5] * out.num_spec_tokens_to_schedule for _ in req_ids])
    sched.update_draft_token_ids_in_output(proposed, out)
    sched.update_from_output(
        out,
        ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
            sampled_token_ids=[[7] * (1 + drafts[rid]) for rid in req_ids],
        ),
    )
    return drafts


def test_cuda_scheduling_is_an_async_scheduler_subclass(tiny: TinyModels) -> None:
    """A `Scheduler` subclass under async execution cost 78 % latency (vLLM issue 43724)."""
    sched = _scheduler(tiny, "uniform")
    assert isinstance(sched, AsyncSpecDepthScheduler)
    assert isinstance(sched, AsyncScheduler)
    assert sched.specgw_depth_rule.policy is BatchDepthPolicy.UNIFORM


def test_drafting_requests_share_the_steps_depth_and_k0_verifies_none(tiny: TinyModels) -> None:
    sched = _scheduler(tiny, "uniform")
    for rid, k in {"one": 1, "two": 2, "zero": 0}.items():
        sched.add_request(_request(rid, k))
    steps = [_step(sched) for _ in range(4)]
    for drafts in steps[1:]:  # step 1 is the prefill
        # No batch-size schedule: the only FULL decode width is 1 + K.
        assert drafts == {"one": K, "two": K, "zero": 0}
    assert sched.specgw_mixed_steps >= 3  # k = 0 beside drafting requests: not one width


def test_per_request_rule_on_the_same_scheduler(tiny: TinyModels) -> None:
    sched = _scheduler(tiny, "per-request")
    for rid, k in {"one": 1, "two": 2, "zero": 0}.items():
        sched.add_request(_request(rid, k))
    steps = [_step(sched) for _ in range(4)]
    assert steps[-1] == {"one": 1, "two": 2, "zero": 0}
    assert sched.specgw_mixed_steps == 0


def test_the_depth_rounds_up_to_a_width_the_schedule_captures(tiny: TinyModels) -> None:
    """Under V2 a batch-size schedule's depths get FULL decode graphs of their own; the
    rule uses one of them, never an uncaptured width (here 1 -> 2, not 4)."""
    sched = _scheduler(tiny, "uniform", schedule=[[1, 2, 2], [3, 16, K]])
    sched.specgw_depth_rule = type(sched.specgw_depth_rule)(
        BatchDepthPolicy.UNIFORM, K, (2, K)
    )  # V2's captured widths for this schedule (the CPU platform here picks V1)
    sched.add_request(_request("one", 1))
    steps = [_step(sched) for _ in range(3)]
    assert steps[-1] == {"one": 2}


def test_the_gateways_capture_schedule_is_no_ceiling_on_k(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The schedule the gateway adds so that V2 captures every width 1 + k
    (`batch_depth.capture_schedule`: 0 from batch 5 on) must not lower a batch's depth:
    eight k = 4 requests verify 4 drafts each; the same schedule set by an operator is a
    ceiling they asked for (0 at that batch size)."""
    # As on CUDA with Triton (the CPU platform here falls back to the V1 runner).
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    rows = capture_schedule(K, 16)
    assert {k for _, _, k in rows} == set(range(K + 1))
    ours = _scheduler(tiny, "uniform", schedule=rows, extra={CAPTURE_SCHEDULE_KEY: True})
    assert ours.specgw_depth_rule.captured == tuple(range(1, K + 1))
    theirs = _scheduler(tiny, "uniform", schedule=rows)
    for sched in (ours, theirs):
        for i in range(8):
            sched.add_request(_request(f"r{i}", K))
    for _ in range(3):
        drafted, capped = _step(ours), _step(theirs)
    assert set(drafted.values()) == {K}
    assert set(capped.values()) == {0}


@pytest.mark.parametrize("policy", ["uniform", "per-request"])
def test_the_shared_placeholder_list_is_never_cut_in_place(policy: str, tiny: TinyModels) -> None:
    """vLLM 0.33 books one list object as every request's placeholders; a cut must copy."""
    sched = _scheduler(tiny, policy)
    sched.add_request(_request("four", 4))
    sched.add_request(_request("one", 1))
    for i in range(3):
        _step(sched)
        shared = sched._spec_token_placeholders
        assert shared == [-1] * len(shared)
        # The prefill step asks for the rule's first-step depth (1 per request; uniform: K,
        # the only captured width here), every later one for K.
        first = sched.specgw_depth_rule.first_step_depth(K)
        assert len(shared) == (first if i == 0 else K)


def _voter(rid: str, vote: StepVote, costs: StepCostTable | None = None) -> Request:
    extra: dict[str, Any] = {SPEC_DEPTH_ARG: K, SPEC_VOTE_ARG: vote.to_arg()}
    if costs is not None:
        extra[SPEC_COSTS_ARG] = costs.to_arg()
    params = SamplingParams(max_tokens=40, temperature=0.0, extra_args=extra)
    return Request(rid, list(range(10, 30)), params, None)


def test_voters_verify_the_step_rules_depth_among_the_captured_widths(tiny: TinyModels) -> None:
    """The step rule on CUDA's scheduler: the voters' depth is the rule's, restricted to
    the widths with a FULL decode graph (here 2 and K), every voter verifying it; a class
    that would lose by any captured depth holds the step at 0 (the guard)."""
    sched = _scheduler(tiny, "uniform")
    sched.specgw_depth_rule = type(sched.specgw_depth_rule)(BatchDepthPolicy.UNIFORM, K, (2, K))
    costs = StepCostTable((1, 16), ((1.0, 1.04, 1.08, 1.10, 1.5),) * 2, ((), ()))
    strong, weak = StepVote((0.95, 0.9, 0.9, 0.3)), StepVote((0.05, 0.05, 0.05, 0.05))
    assert vote_step_depth([strong, strong], costs, 2, False) == 3  # not a captured width
    assert vote_step_depth([strong, strong], costs, 2, False, (2, K)) == 2
    sched.add_request(_voter("a", strong, costs))
    sched.add_request(_voter("b", strong))
    steps = [_step(sched) for _ in range(3)]
    assert steps[-1] == {"a": 2, "b": 2}
    # A class that loses at every captured depth holds its step at 0 (the guard).
    assert vote_step_depth([strong, strong, weak], costs, 3, False, (2, K)) == 0
    sched.add_request(_voter("weak", weak))
    steps = [_step(sched) for _ in range(3)]
    assert steps[-1] == {"a": 0, "b": 0, "weak": 0}
    assert set(sched.specgw_voted_steps) == {0, 2}


def test_a_step_no_request_drafts_in_is_marked_for_the_drafter_skip(tiny: TinyModels) -> None:
    """`DRAFTER_IDLE` (`engine.vllm.draft_skip`, Model Runner V2's skip): set on a step
    only while every request in it has k = 0, which never rises; a drafting newcomer or
    a voter the step rule holds at 0 keeps the drafter's KV pass. The mark is an
    attribute of vLLM's `SchedulerOutput`, so it must survive the pickling that takes
    the step to the workers."""
    sched = _scheduler(tiny, "uniform")
    for rid in ("a", "b"):
        sched.add_request(_request(rid, 0))
    outputs: list[Any] = []
    for _ in range(3):
        _step(sched, outputs)
    sched.add_request(_request("drafts", 2))
    for _ in range(2):
        _step(sched, outputs)
    idle = [getattr(out, DRAFTER_IDLE) for out in outputs]
    assert idle == [True, True, True, False, False]
    assert getattr(pickle.loads(pickle.dumps(outputs[0])), DRAFTER_IDLE) is True

    held = _scheduler(tiny, "uniform")
    held.specgw_depth_rule = type(held.specgw_depth_rule)(BatchDepthPolicy.UNIFORM, K, (2, K))
    costs = StepCostTable((1, 16), ((1.0, 1.04, 1.08, 1.10, 1.5),) * 2, ((), ()))
    held.add_request(_voter("weak", StepVote((0.05,) * 4), costs))
    outputs.clear()
    steps = [_step(held, outputs) for _ in range(3)]
    assert steps[-1] == {"weak": 0}  # held at 0: its drafter KV must stay whole
    assert [getattr(out, DRAFTER_IDLE) for out in outputs] == [False] * 3
