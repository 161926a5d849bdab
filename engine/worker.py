"""The gateway's vLLM worker extension: what `worker_extension_cls` names.

vLLM mixes one class into its worker; each part is a method the engine calls once
through `collective_rpc` after start (`engine.vllm_engine.VLLMEngine.started`).
"""

from __future__ import annotations

from engine.depth_zero_params import DepthZeroParamsExtension
from engine.draft_skip import DraftSkipExtension
from engine.expand_fix import ExpandFixExtension


class SpecGatewayWorker(DraftSkipExtension, ExpandFixExtension, DepthZeroParamsExtension):
    """Draft skip at depth 0 (`engine.draft_skip`), the CPU sampler's expand fix
    (`engine.expand_fix`) and min-p / logit-bias at depth 0 (`engine.depth_zero_params`)."""
