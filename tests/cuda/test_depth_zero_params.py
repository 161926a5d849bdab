"""`min_p` and `logit_bias` at k = 0 against vLLM 0.33 (`engine.vllm.depth_zero_params`): the CPU
tier's tests on 0.33's classes (the same check and message, the V1 runner's missing
processors and their install, the V1 sampler code, the depth that never rises), and
Model Runner V2, where the install declines and vLLM's 400 stays.

What V2 does with both parameters is pinned too: it is why V2 is the candidate to serve
them next (its sampler applies them to every logits row, drafting or not), and a GPU run
comparing its k = 0 outputs with an engine without a drafter is what it still lacks.
"""

from __future__ import annotations

import inspect

from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2
from vllm.v1.worker.gpu.sample.sampler import Sampler as SamplerV2
from vllm.v1.worker.gpu.spec_decode.rejection_sampler import RejectionSampler as RejectionV2

from engine.vllm.depth_zero_params import DepthZeroParamsExtension
from tests.engine.test_depth_zero_params import *  # noqa: F403


class _WorkerV2(DepthZeroParamsExtension):
    def __init__(self, runner: object) -> None:
        self.model_runner = runner


def test_v2_runner_declines_the_install_so_vllms_refusal_stays() -> None:
    runner = object.__new__(RunnerV2)
    runner.speculative_config = object()  # type: ignore[attr-defined]
    assert _WorkerV2(runner).specgw_install_depth_zero_params() is False


def test_v2_applies_both_parameters_to_every_logits_row_when_verifying() -> None:
    init = inspect.getsource(SamplerV2.__init__)
    assert "LogitBiasState(" in init  # built whether or not the engine drafts
    apply = inspect.getsource(SamplerV2.apply_sampling_params)
    assert "for processor in self.logits_processors:" in apply
    assert "self.sampling_states.apply_min_p(logits, expanded_idx_mapping" in apply
    verify = inspect.getsource(RejectionV2._verify)
    assert "self.sampler.apply_sampling_params(" in verify
