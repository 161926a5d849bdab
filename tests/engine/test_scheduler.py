"""The depth-capping schedulers, driven step by step without a model (as vLLM's
own `tests/v1/core` do): real vLLM config, KV-cache manager and requests; the
model runner's side (sampled tokens, drafts) is played by the test.

Runs on CPU for both flavours: the async scheduler is what GPUs use by default.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from engine.interface import SPEC_CAP_ARG, SPEC_DEPTH_ARG
from engine.settings import EngineSettings
from engine.vllm.batch_depth import FIRST_STEP_KEY, PREFILL_STEP_KEY
from engine.vllm.engine_args import engine_args
from engine.vllm.scheduler import (
    AsyncSpecDepthScheduler,
    AutoSpecDepthScheduler,
    SpecDepthScheduler,
    requested_depth,
)
from tools.model.testing_models import TinyModels

K = 4
BLOCK = 16


def _scheduler(cls: type[Any], tiny: TinyModels, async_scheduling: bool = False) -> Any:
    config = EngineArgs(
        model=str(tiny.target),
        speculative_config={
            "method": "eagle3",
            "model": str(tiny.drafter),
            "num_speculative_tokens": K,
        },
        max_model_len=512,
        max_num_seqs=16,
        enforce_eager=True,
        dtype="float32",
        enable_prefix_caching=False,  # requests built here carry no block hasher
    ).create_engine_config()
    config.cache_config.num_gpu_blocks = 1000  # what the engine sets after profiling
    config.scheduler_config.async_scheduling = async_scheduling  # as vLLM resolves it
    kv = KVCacheConfig(
        num_blocks=1000,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(
                ["layer"],
                FullAttentionSpec(
                    block_size=BLOCK, num_kv_heads=1, head_size=32, dtype=torch.float32
                ),
            )
        ],
    )
    return cls(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
        log_stats=True,
    )


def _request(rid: str, k: int | None, cap: int | None = None) -> Request:
    extra: dict[str, Any] | None = {SPEC_DEPTH_ARG: k} if k is not None else None
    if cap is not None:
        extra = {**(extra or {}), SPEC_CAP_ARG: cap}
    params = SamplingParams(max_tokens=50, temperature=0.0, extra_args=extra)
    return Request(rid, list(range(10, 30)), params, None)


def _run_step(sched: Any, out: SchedulerOutput, accept_all: bool = True) -> None:
    """Play the model runner: sample 1 + (accepted drafts) tokens per request, then draft K."""
    req_ids = list(out.num_scheduled_tokens)
    sampled = []
    for rid in req_ids:
        drafts = out.scheduled_spec_decode_tokens.get(rid, [])
        sampled.append([7] * (1 + (len(drafts) if accept_all else 0)))
    runner_out = ModelRunnerOutput(
        req_ids=req_ids,
        req_id_to_index={rid: i for i, rid in enumerate(req_ids)},
        sampled_token_ids=sampled,
    )
    # The drafter proposes as many tokens as the step asked for (dynamic-SD knob).
    proposed = DraftTokenIds(req_ids, [[5] * out.num_spec_tokens_to_schedule for _ in req_ids])
    if isinstance(sched, AsyncSpecDepthScheduler):
        sched.update_draft_token_ids_in_output(proposed, out)
        sched.update_from_output(out, runner_out)
    else:
        sched.update_from_output(out, runner_out)
        sched.update_draft_token_ids(proposed)


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_each_request_gets_at_most_its_k_drafts(cls: type[Any], tiny: TinyModels) -> None:
    sched = _scheduler(cls, tiny)
    depths = {"k0": 0, "k1": 1, "k2": 2, "k4": 4, "kdefault": None, "k9": 9}
    for rid, k in depths.items():
        sched.add_request(_request(rid, k))
    expected = {rid: requested_depth(sched.requests[rid], K) for rid in depths}
    assert expected == {"k0": 0, "k1": 1, "k2": 2, "k4": 4, "kdefault": K, "k9": K}
    seen: dict[str, list[int]] = {rid: [] for rid in depths}
    asked = []
    for _ in range(6):
        out = sched.schedule()
        asked.append(out.num_spec_tokens_to_schedule)
        for rid in out.num_scheduled_tokens:
            seen[rid].append(len(out.scheduled_spec_decode_tokens.get(rid, [])))
        _run_step(sched, out)
    # The prefill step asks for one draft (first_step_depth), every later one for K.
    assert asked == [1] + [K] * 5
    for rid, counts in seen.items():
        # Step 1 is the prefill (no drafts yet), step 2 verifies its one draft;
        # afterwards exactly min(k, K) each step.
        assert counts[0] == 0
        assert counts[1] == min(expected[rid], 1), (rid, counts)
        assert counts[2:] == [expected[rid]] * (len(counts) - 2), (rid, counts)


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_a_prefill_only_step_drafts_once_and_a_mixed_one_keeps_its_depth(
    cls: type[Any], tiny: TinyModels
) -> None:
    """The first token does not wait for K - 1 draft passes whose drafts only the next
    step would verify; a prefill beside running decodes leaves their depth alone."""
    sched = _scheduler(cls, tiny)
    sched.add_request(_request("first", 3))
    out = sched.schedule()
    assert out.num_spec_tokens_to_schedule == 1
    _run_step(sched, out)
    out = sched.schedule()  # its first decode step: one draft verified, three asked for
    assert len(out.scheduled_spec_decode_tokens["first"]) == 1  # async: a placeholder
    assert out.num_spec_tokens_to_schedule == 3
    _run_step(sched, out)
    sched.add_request(_request("late", 2))
    out = sched.schedule()  # "late" prefills beside "first" decoding: the step keeps 3
    assert out.num_spec_tokens_to_schedule == 3
    assert len(out.scheduled_spec_decode_tokens["first"]) == 3
    _run_step(sched, out)
    out = sched.schedule()
    assert len(out.scheduled_spec_decode_tokens["late"]) == 2  # drafted in a full step


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_a_prefill_step_cap_holds_a_mixed_step_too(cls: type[Any], tiny: TinyModels) -> None:
    """Configured (`prefill_step_cap`), a step in which a newcomer prefills beside a
    decoding request drafts once, and the decoder verifies one draft in the next step,
    then its k again."""
    sched = _scheduler(cls, tiny)
    sched.specgw_depth_rule = replace(sched.specgw_depth_rule, prefill_step_cap=1)
    sched.add_request(_request("first", 3))
    for _ in range(2):  # its prefill step, then its first decode step
        _run_step(sched, sched.schedule())
    sched.add_request(_request("late", 2))
    out = sched.schedule()  # "late" prefills beside "first" decoding
    assert out.num_spec_tokens_to_schedule == 1
    assert len(out.scheduled_spec_decode_tokens["first"]) == 3  # drafted before "late" came
    _run_step(sched, out)
    out = sched.schedule()
    assert len(out.scheduled_spec_decode_tokens["first"]) == 1
    assert len(out.scheduled_spec_decode_tokens["late"]) == 1
    assert out.num_spec_tokens_to_schedule == 3
    _run_step(sched, out)
    out = sched.schedule()
    assert len(out.scheduled_spec_decode_tokens["first"]) == 3
    assert len(out.scheduled_spec_decode_tokens["late"]) == 2


def test_the_first_step_cap_can_be_turned_off(tiny: TinyModels) -> None:
    sched = _scheduler(SpecDepthScheduler, tiny)
    sched.specgw_depth_rule = replace(sched.specgw_depth_rule, first_step_cap=None)
    sched.add_request(_request("first", 3))
    assert sched.schedule().num_spec_tokens_to_schedule == 3


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_drafter_asked_for_the_largest_k_in_the_step(cls: type[Any], tiny: TinyModels) -> None:
    sched = _scheduler(cls, tiny)
    sched.add_request(_request("a", 0))
    sched.add_request(_request("b", 0))
    out = sched.schedule()
    assert out.num_spec_tokens_to_schedule == 0  # a batch of k = 0 pays for no draft steps
    _run_step(sched, out)
    sched.add_request(_request("c", 2))
    for _ in range(3):
        out = sched.schedule()
        assert out.num_spec_tokens_to_schedule == 2
        assert not out.scheduled_spec_decode_tokens.get("a")
        _run_step(sched, out)
    assert len(out.scheduled_spec_decode_tokens.get("c", [])) == 2


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_capped_requests_record_no_verify_step(cls: type[Any], tiny: TinyModels) -> None:
    """vLLM records a verify step only where drafts were scheduled (engine/vllm/outcome.py)."""
    sched = _scheduler(cls, tiny)
    sched.add_request(_request("zero", 0))
    sched.add_request(_request("two", 2))
    for _ in range(4):
        _run_step(sched, sched.schedule())
    zero, two = sched.requests["zero"], sched.requests["two"]
    assert zero.spec_decode_metrics is None or sum(zero.spec_decode_metrics.histogram) == 0
    if two.spec_decode_metrics is not None:  # only with per-request metrics on
        assert two.spec_decode_metrics.num_draft_tokens == 2 * sum(
            two.spec_decode_metrics.histogram
        )


@pytest.mark.parametrize("cls", [SpecDepthScheduler, AsyncSpecDepthScheduler])
def test_a_newcomers_cap_lowers_the_requests_in_flight_for_good(
    cls: type[Any], tiny: TinyModels
) -> None:
    """A request carrying a cap lowers every request already there to it (drafts of the
    next step included), never raises one, and leaves later requests their own k."""
    sched = _scheduler(cls, tiny)
    sched.add_request(_request("deep", 4))
    sched.add_request(_request("two", 2))
    for _ in range(3):
        _run_step(sched, sched.schedule())
    sched.add_request(_request("guarded", 0, cap=1))
    assert sched.specgw_capped == 2
    sched.add_request(_request("late", 3))  # after the cap: keeps its own k
    drafts: dict[str, list[int]] = {rid: [] for rid in ("deep", "two", "guarded", "late")}
    for _ in range(3):
        out = sched.schedule()
        for rid in out.num_scheduled_tokens:
            drafts[rid].append(len(out.scheduled_spec_decode_tokens.get(rid, [])))
        _run_step(sched, out)
    assert drafts["deep"] == [1, 1, 1]
    assert drafts["two"] == [1, 1, 1]
    assert drafts["guarded"] == [0, 0, 0]
    assert drafts["late"][1:] == [3, 3]  # its first step is its prefill
    sched.add_request(_request("floor", 0, cap=0))
    assert sched.specgw_capped == 5  # deep and two (1 -> 0), late (3 -> 0); not guarded
    sched.add_request(_request("higher", 4, cap=4))  # a cap above every k: no change
    assert sched.specgw_capped == 5
    out = sched.schedule()
    assert all(
        not out.scheduled_spec_decode_tokens.get(rid)
        for rid in ("deep", "two", "guarded", "late", "floor")
    )
    assert out.num_spec_tokens_to_schedule == 4  # only for "higher", which asked for 4


def test_resumed_request_is_not_padded_to_k(tiny: TinyModels) -> None:
    """vLLM pads a 1-token resumed request to K placeholder drafts; not for k < K."""
    sched = _scheduler(SpecDepthScheduler, tiny)
    assert sched.dynamic_sd_lookup is not None
    assert set(sched.dynamic_sd_lookup) == {K}


@pytest.mark.parametrize(
    ("flavour", "cls", "async_scheduling"),
    [
        ("auto", "AutoSpecDepthScheduler", None),
        ("sync", "SpecDepthScheduler", False),
        ("async", "AsyncSpecDepthScheduler", True),
    ],
)
def test_engine_args_pair_the_scheduler_class_with_its_mode(
    flavour: str, cls: str, async_scheduling: bool | None, tiny: TinyModels
) -> None:
    settings = EngineSettings(model=tiny.target, drafter=tiny.drafter, scheduler=flavour)
    args = engine_args(settings)
    assert (args.scheduler_cls, args.async_scheduling) == (
        f"engine.vllm.scheduler.{cls}",
        async_scheduling,
    )


def test_cpu_blocks_default_to_32_tokens_and_a_setting_wins(tiny: TinyModels) -> None:
    """vLLM's CPU default (128) makes each EAGLE prefix-cache hit recompute a whole block."""
    settings = EngineSettings(model=tiny.target, drafter=tiny.drafter)
    assert engine_args(settings).block_size == 32  # this suite runs on the CPU build
    assert engine_args(settings.model_copy(update={"block_size": 64})).block_size == 64
    extra = settings.model_copy(update={"extra_args": {"block_size": 128}})
    assert engine_args(extra).block_size == 128


def test_the_prefill_step_depth_setting_reaches_the_rule(tiny: TinyModels) -> None:
    settings = EngineSettings(model=tiny.target, drafter=tiny.drafter)
    assert engine_args(settings).additional_config in (None, {})
    capped = settings.model_copy(update={"prefill_step_depth": 1})
    assert engine_args(capped).additional_config == {PREFILL_STEP_KEY: 1}
    # Beside an operator's additional_config in extra_args, not replaced by it.
    both = capped.model_copy(update={"extra_args": {"additional_config": {FIRST_STEP_KEY: 2}}})
    assert engine_args(both).additional_config == {FIRST_STEP_KEY: 2, PREFILL_STEP_KEY: 1}


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_auto_scheduler_is_the_flavour_vllm_resolved(
    async_scheduling: bool, tiny: TinyModels
) -> None:
    """CUDA turns async scheduling on by default after the engine arguments are built."""
    sched = _scheduler(AutoSpecDepthScheduler, tiny, async_scheduling)
    want = AsyncSpecDepthScheduler if async_scheduling else SpecDepthScheduler
    assert type(sched) is want
    sched.add_request(_request("k1", 1))
    for _ in range(3):
        out = sched.schedule()
        assert len(out.scheduled_spec_decode_tokens.get("k1", [])) <= 1
        _run_step(sched, out)


def test_batch_size_schedule_reaches_vllms_speculative_config(tiny: TinyModels) -> None:
    schedule = [(1, 1, 2), (2, 1024, 1)]
    settings = EngineSettings(
        model=tiny.target, drafter=tiny.drafter, max_depth=2, spec_tokens_per_batch_size=schedule
    )
    spec = engine_args(settings).speculative_config
    assert spec is not None
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 1, 2], [2, 1024, 1]]
    assert spec["num_speculative_tokens"] == 2


@pytest.mark.parametrize("row", [(0, 4, 1), (5, 4, 1), (1, 4, 3)])
def test_a_batch_size_schedule_row_out_of_range_is_refused(row: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="spec_tokens_per_batch_size row"):
        EngineSettings(max_depth=2, spec_tokens_per_batch_size=[row])


def test_the_batch_size_schedule_reads_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPECGW_ENGINE_SPEC_TOKENS_PER_BATCH_SIZE", "[[1, 1, 4], [2, 64, 1]]")
    assert EngineSettings().spec_tokens_per_batch_size == [(1, 1, 4), (2, 64, 1)]
