"""The gateway's vLLM worker extension: what `worker_extension_cls` names.

vLLM mixes one class into its worker; each part is a method the engine calls once
through `collective_rpc` after start (`engine.vllm.engine.VLLMEngine.started`).
"""

from __future__ import annotations

from engine.vllm.class_verification import ClassVerificationExtension
from engine.vllm.depth_zero_params import DepthZeroParamsExtension
from engine.vllm.draft_confidence import DraftConfidenceExtension
from engine.vllm.draft_skip import DraftSkipExtension
from engine.vllm.expand_fix import ExpandFixExtension


class SpecGatewayWorker(
    DraftSkipExtension,
    ExpandFixExtension,
    DepthZeroParamsExtension,
    DraftConfidenceExtension,
    ClassVerificationExtension,
):
    """Draft skip at depth 0 (`engine.vllm.draft_skip`), the CPU sampler's expand fix
    (`engine.vllm.expand_fix`), min-p / logit-bias at depth 0
    (`engine.vllm.depth_zero_params`) and, installed on request, the drafter's confidence
    per draft (`engine.vllm.draft_confidence`) and, under Model Runner V2's adaptive
    verification, the class bounds and per-class calibration
    (`engine.vllm.class_verification`)."""
