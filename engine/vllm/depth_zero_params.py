"""`min_p` and `logit_bias` on a speculative engine, for requests that never draft (k = 0).

vLLM refuses both whenever the engine has a speculative config, in the front-end's
input processor (`SamplingParams.verify` -> `_validate_spec_decode`: "The min_p and
logit_bias sampling parameters are not yet supported with speculative decoding."), and
its V1 model runner builds neither logits processor under one
(`vllm/v1/sample/logits_processor/__init__.py: build_logitsprocs` keeps MinTokens only).
Lifting the check alone would ignore both parameters silently.

What makes a request without drafts exact once the processors exist (V1 runner, the
CPU runner's base, vLLM 0.32 and 0.33):

* A step where no request drafts takes the plain sampler (`GPUModelRunner._sample` with
  no spec-decode metadata), as on an engine without a drafter.
* In a step where others draft, a request without drafts has one logits row, its bonus
  row. `RejectionSampler.forward` samples every bonus row with
  `Sampler(..., predict_bonus_token=True)`, one row per request in batch order, which
  applies all logits processors (`Sampler.apply_logits_processors`, `Sampler.sample`);
  draft rows get MinTokens only (`RejectionSampler.apply_logits_processors`), and a
  request has none. Its seeded generator is not drawn for draft rows it lacks
  (`generate_uniform_probs`, `sample_recovered_tokens` skip n == 0).
* The gateway runs every request carrying either parameter at k = 0, and the
  scheduler never raises a depth (`engine.vllm.scheduler`: a cap only lowers; the batch-depth
  rule gives k = 0 no drafts in any step).

Two parts, installed once at engine start (`VLLMEngine.started`), before any request:

* `DepthZeroParamsExtension.specgw_install_depth_zero_params` (worker): adds vLLM's own
  `LogitBiasLogitsProcessor` and `MinPLogitsProcessor` to the V1 runner's input batch.
  A request without those parameters leaves them idle.
* `accept_at_depth_zero()` (front-end, this process): wraps `_validate_spec_decode` so
  that it passes a request whose `extra_args[SPEC_DEPTH_ARG]` is 0. Any other depth, or
  none (the scheduler reads a missing depth as K), meets vLLM's own check and message.

Model Runner V2 (vLLM 0.33's CUDA default) applies both parameters to every logits row
in its own sampler (`vllm/v1/worker/gpu/sample/sampler.py: Sampler.apply_sampling_params`,
which `spec_decode/rejection_sampler.py: RejectionSampler._verify` calls too), but its
bonus row is drawn by the rejection kernel, not the plain sampler's, and no test here runs
it: the install returns False there and vLLM's 400 stays.
`tests/engine/test_depth_zero_params.py` and `tests/cuda/test_depth_zero_params.py` fail
when vLLM moves any of the code above.
"""

from __future__ import annotations

from typing import Any

from engine.depth_zero import SAMPLING_EPS, VLLM_REFUSAL, refused_with_drafts
from engine.interface import SPEC_DEPTH_ARG, depth_arg


def never_drafts(extra_args: dict[str, Any] | None) -> bool:
    """Whether the scheduler reads the request's depth as 0 (`engine.vllm.scheduler`
    reads it with the same `depth_arg`; missing or unreadable is K)."""
    return depth_arg(extra_args, SPEC_DEPTH_ARG) == 0


def accept_at_depth_zero() -> bool:
    """Let vLLM's spec-decode check pass requests that never draft; once per process.

    False (nothing changed) where vLLM has no such check to wrap.
    """
    from vllm.sampling_params import SamplingParams

    validate = getattr(SamplingParams, "_validate_spec_decode", None)
    if validate is None:
        return False
    if getattr(validate, "_specgw", False):
        return True

    def validate_unless_depth_zero(self: SamplingParams, speculative_config: Any) -> None:
        if speculative_config is not None and never_drafts(self.extra_args):
            return
        validate(self, speculative_config)

    validate_unless_depth_zero._specgw = True  # type: ignore[attr-defined]
    validate_unless_depth_zero.__wrapped__ = validate  # type: ignore[attr-defined]
    SamplingParams._validate_spec_decode = validate_unless_depth_zero  # type: ignore[method-assign]
    return True


async def serve_depth_zero_params(llm: Any) -> bool:
    """Both parts, on a started `AsyncLLM` with a drafter before its first request: whether
    every worker added the processors and the check now passes k = 0 requests."""
    served = await llm.collective_rpc("specgw_install_depth_zero_params")
    return bool(served) and all(served) and accept_at_depth_zero()


def is_v1_runner(runner: Any) -> bool:
    """The V1 model runner (CUDA's `gpu_model_runner`, and the CPU runner built on it)."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    return isinstance(runner, GPUModelRunner)


class DepthZeroParamsExtension:
    """Worker extension (mixed into vLLM's worker class by `worker_extension_cls`)."""

    def specgw_install_depth_zero_params(self) -> bool:
        """Add the min-p and logit-bias processors to a V1 runner with a drafter.

        False (nothing changed) on another runner, without a drafter, or with requests
        already in the batch (the processors learn requests as they are added).
        """
        from vllm.utils.torch_utils import PIN_MEMORY
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.logits_processor.builtin import (
            LogitBiasLogitsProcessor,
            MinPLogitsProcessor,
        )

        runner: Any = getattr(self, "model_runner", None)
        batch: Any = getattr(runner, "input_batch", None)
        procs = getattr(batch, "logitsprocs", None)
        if (
            runner is None
            or getattr(runner, "speculative_config", None) is None
            or not is_v1_runner(runner)
            or not isinstance(procs, LogitsProcessors)
            or batch.num_reqs != 0
        ):
            return False
        present = list(procs.all)
        for cls in (LogitBiasLogitsProcessor, MinPLogitsProcessor):
            if not any(isinstance(p, cls) for p in present):
                # What `build_logitsprocs` passes them on an engine without a drafter.
                present.append(cls(runner.vllm_config, runner.device, PIN_MEMORY))
        batch.logitsprocs = LogitsProcessors(present)
        batch.sampling_metadata = batch._make_sampling_metadata()
        return True


__all__ = [
    "SAMPLING_EPS",
    "VLLM_REFUSAL",
    "DepthZeroParamsExtension",
    "accept_at_depth_zero",
    "never_drafts",
    "refused_with_drafts",
    "serve_depth_zero_params",
]
