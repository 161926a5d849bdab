"""`min_p` and `logit_bias` at k = 0 on a speculative engine (`engine.vllm.depth_zero_params`),
against the installed vLLM's own classes: the check it wraps, the processors it adds, the
sampler code that makes a request without drafts exact, and the depth that never rises.

If a later vLLM moves any of it, this fails before a request is sampled wrongly. The
outputs themselves are compared on a real engine in `tests/gateway/test_depth_zero_params.py`.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from vllm import SamplingParams
from vllm.engine.arg_utils import EngineArgs
from vllm.exceptions import VLLMValidationError
from vllm.v1.engine.input_processor import InputProcessor
from vllm.v1.sample import rejection_sampler
from vllm.v1.sample.logits_processor import LogitsProcessors, build_logitsprocs
from vllm.v1.sample.logits_processor.builtin import (
    LogitBiasLogitsProcessor,
    MinPLogitsProcessor,
    MinTokensLogitsProcessor,
)
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler
from vllm.v1.worker.gpu_input_batch import InputBatch
from vllm.v1.worker.gpu_model_runner import GPUModelRunner

from engine.interface import SPEC_DEPTH_ARG
from engine.protocol import ChatCompletionRequest
from engine.vllm.batch_depth import BatchDepthPolicy, DepthRule
from engine.vllm.depth_zero_params import (
    VLLM_REFUSAL,
    DepthZeroParamsExtension,
    accept_at_depth_zero,
    never_drafts,
    refused_with_drafts,
)
from engine.vllm.openai_frontend import OpenAIFrontend
from engine.vllm.scheduler import SpecDepthScheduler
from tests.engine.test_scheduler import K, _request, _run_step, _scheduler
from tools.model.testing_models import TinyModels

BIASED = {"logit_bias": {42: -100.0}, "min_p": 0.1}


@pytest.fixture
def restored() -> Iterator[None]:
    """vLLM's own check back after the test (the wrapper is process-wide)."""
    original = SamplingParams._validate_spec_decode
    yield
    SamplingParams._validate_spec_decode = original  # type: ignore[method-assign]


def _params(depth: Any = None, **kw: Any) -> SamplingParams:
    extra = {SPEC_DEPTH_ARG: depth} if depth is not None else None
    return SamplingParams(max_tokens=8, extra_args=extra, **kw)


def test_vllm_refuses_both_parameters_with_a_drafter_in_the_input_processor() -> None:
    spec = object()  # the check reads only whether a speculative config is there
    for kw in ({"logit_bias": {42: 1.0}}, {"min_p": 0.1}):
        with pytest.raises(VLLMValidationError) as refused:
            _params(0, **kw)._validate_spec_decode(spec)  # type: ignore[arg-type]
        assert str(refused.value.args[0]) == VLLM_REFUSAL
        _params(0, **kw)._validate_spec_decode(None)  # no drafter: served
    assert "self._validate_spec_decode(speculative_config)" in inspect.getsource(
        SamplingParams.verify
    )
    validate = inspect.getsource(InputProcessor._validate_params)
    assert "params.verify(" in validate
    assert "self.speculative_config" in validate


def test_the_wrapped_check_passes_only_a_request_that_never_drafts(restored: None) -> None:
    assert accept_at_depth_zero() is True
    assert accept_at_depth_zero() is True  # once: the second call finds its own wrapper
    wrapped = SamplingParams._validate_spec_decode
    assert wrapped.__wrapped__.__name__ == "_validate_spec_decode"  # type: ignore[attr-defined]
    spec = object()
    _params(0, **BIASED)._validate_spec_decode(spec)  # type: ignore[arg-type]
    _params("0", **BIASED)._validate_spec_decode(spec)  # type: ignore[arg-type]
    for depth in (1, K, None, "deep"):  # None: the scheduler reads a missing depth as K
        with pytest.raises(VLLMValidationError, match="not yet supported"):
            _params(depth, **BIASED)._validate_spec_decode(spec)  # type: ignore[arg-type]
    _params(3)._validate_spec_decode(spec)  # type: ignore[arg-type]  # nothing to refuse


@pytest.mark.parametrize(
    ("extra", "never"),
    [
        (None, False),
        ({}, False),
        ({SPEC_DEPTH_ARG: 0}, True),
        ({SPEC_DEPTH_ARG: -1}, True),
        ({SPEC_DEPTH_ARG: 2}, False),
        ({SPEC_DEPTH_ARG: None}, False),
    ],
)
def test_never_drafts_reads_the_depth_as_the_scheduler_does(
    extra: dict[str, Any] | None, never: bool
) -> None:
    assert never_drafts(extra) is never


def test_the_fakes_refusal_is_vllms_rule() -> None:
    assert refused_with_drafts({"1": 2.0}, None)
    assert refused_with_drafts(None, 0.2)
    assert not refused_with_drafts({}, 0.0)
    assert not refused_with_drafts(None, None)


def _config(tiny: TinyModels) -> Any:
    return EngineArgs(
        model=str(tiny.target),
        speculative_config={
            "method": "eagle3",
            "model": str(tiny.drafter),
            "num_speculative_tokens": K,
        },
        max_model_len=256,
        max_num_seqs=4,
        enforce_eager=True,
        dtype="float32",
    ).create_engine_config()


def _kinds(procs: LogitsProcessors) -> set[type[Any]]:
    return {type(p) for p in procs.all}


def test_a_speculative_config_builds_neither_processor(tiny: TinyModels) -> None:
    """Why lifting the check alone is not enough: vLLM leaves both processors out."""
    cpu = torch.device("cpu")
    config = _config(tiny)
    assert _kinds(build_logitsprocs(config, cpu, False, False)) == {MinTokensLogitsProcessor}
    config.speculative_config = None
    plain = _kinds(build_logitsprocs(config, cpu, False, False))
    assert {LogitBiasLogitsProcessor, MinPLogitsProcessor} <= plain


class _Worker(DepthZeroParamsExtension):
    def __init__(self, runner: Any) -> None:
        self.model_runner = runner


def _v1_runner(tiny: TinyModels) -> Any:
    config = _config(tiny)
    cpu = torch.device("cpu")
    runner = object.__new__(GPUModelRunner)
    runner.vllm_config = config
    runner.speculative_config = config.speculative_config
    runner.device = cpu
    runner.input_batch = InputBatch(
        max_num_reqs=4,
        max_model_len=256,
        max_num_batched_tokens=256,
        device=cpu,
        vocab_size=config.model_config.get_vocab_size(),
        block_sizes=[16],
        max_num_blocks_per_req=[16],
        logitsprocs=build_logitsprocs(config, cpu, False, False),
        num_spec_tokens=K,
    )
    return runner


def test_the_install_adds_vllms_processors_to_a_v1_runner_once(tiny: TinyModels) -> None:
    runner = _v1_runner(tiny)
    worker = _Worker(runner)
    assert worker.specgw_install_depth_zero_params() is True
    batch = runner.input_batch
    expected = {MinTokensLogitsProcessor, LogitBiasLogitsProcessor, MinPLogitsProcessor}
    assert _kinds(batch.logitsprocs) == expected
    assert batch.sampling_metadata.logitsprocs is batch.logitsprocs
    assert worker.specgw_install_depth_zero_params() is True
    assert len(list(batch.logitsprocs.all)) == 3  # not added twice
    runner.speculative_config = None
    assert worker.specgw_install_depth_zero_params() is False  # no drafter: vLLM's own set
    assert _Worker(None).specgw_install_depth_zero_params() is False


def test_a_request_without_drafts_samples_its_bonus_row_with_every_processor() -> None:
    """The V1 sampler code the exactness rests on (module docstring)."""
    forward = inspect.getsource(RejectionSampler.forward)
    assert "bonus_logits = logits[bonus_logits_indices]" in forward
    assert "predict_bonus_token=True" in forward
    drafts = inspect.getsource(RejectionSampler.apply_logits_processors)
    assert "isinstance(processor, MinTokensLogitsProcessor)" in drafts  # draft rows: only it
    assert "logitsprocs.non_argmax_invariant" in inspect.getsource(Sampler.apply_logits_processors)
    assert "logitsprocs.argmax_invariant" in inspect.getsource(Sampler.sample)
    # A seeded request's generator is drawn only for draft rows it has.
    assert "if n == 0:" in inspect.getsource(rejection_sampler.generate_uniform_probs)
    assert "num_draft_tokens[i] > 0" in inspect.getsource(rejection_sampler.sample_recovered_tokens)
    sample = inspect.getsource(GPUModelRunner._sample)
    assert "if spec_decode_metadata is None:" in sample  # no drafts in the step: plain sampler


@pytest.mark.parametrize("policy", list(BatchDepthPolicy))
def test_the_batch_depth_rule_gives_depth_zero_no_drafts(policy: BatchDepthPolicy) -> None:
    rule = DepthRule(policy, max_depth=K, captured=tuple(range(1, K + 1)))
    assert all(rule.drafts_for(0, step) == 0 for step in range(K + 1))


def test_a_depth_zero_request_is_never_raised(tiny: TinyModels) -> None:
    """Neither deeper batch-mates nor a newcomer's cap (which only lowers) give a k = 0
    request a draft, and its depth stays 0 for its life."""
    sched = _scheduler(SpecDepthScheduler, tiny)
    sched.add_request(_request("biased", 0))
    sched.add_request(_request("deep", K))
    drafts: list[int] = []
    for step in range(5):
        if step == 2:
            sched.add_request(_request("newcomer", K, cap=K))  # a cap above 0: no change
        out = sched.schedule()
        drafts.append(len(out.scheduled_spec_decode_tokens.get("biased", [])))
        _run_step(sched, out)
    assert drafts == [0] * 5
    assert sched._depth(sched.requests["biased"]) == 0


def test_a_generation_config_min_p_reaches_the_serving_defaults(tiny: TinyModels) -> None:
    """vLLM fills a request's unset min_p from the model's generation config (or
    `override_generation_config`) through `get_diff_sampling_param`, which its serving
    layer keeps as `default_sampling_params`: what `OpenAIFrontend.sampling_of` reads, so
    the gateway plans such requests at k = 0 instead of meeting vLLM's refusal."""
    config = EngineArgs(
        model=str(tiny.target), override_generation_config={"min_p": 0.05}
    ).create_model_config()
    assert config.get_diff_sampling_param().get("min_p") == 0.05
    frontend = object.__new__(OpenAIFrontend)
    serving = SimpleNamespace(default_sampling_params=config.get_diff_sampling_param())
    frontend._state = SimpleNamespace(  # type: ignore[attr-defined]
        openai_serving_chat=serving, openai_serving_completion=serving
    )
    frontend._lossless_sampling = True  # type: ignore[attr-defined]
    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert frontend.sampling_of(request).min_p == 0.05
    own = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "min_p": 0.0}
    )
    assert frontend.sampling_of(own).min_p == 0.0
