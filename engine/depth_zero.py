"""`min_p` and `logit_bias` with a drafter: vLLM's rule, which both backends follow.

vLLM refuses both parameters on an engine with a speculative config
(`SamplingParams._validate_spec_decode`); the vLLM backend lets a request that never
drafts (k = 0) through (`engine.vllm.depth_zero_params`), and the fake engine repeats
the refusal for any other. Engine-agnostic: the fake imports it without vLLM.
"""

from __future__ import annotations

from typing import Any

#: vLLM's refusal (`SamplingParams._validate_spec_decode`), which the fake engine repeats.
VLLM_REFUSAL = (
    "The min_p and logit_bias sampling parameters are not yet supported with speculative decoding."
)
#: vLLM's bound below which `min_p` is unset (`vllm.sampling_params._SAMPLING_EPS`).
SAMPLING_EPS = 1e-5


def refused_with_drafts(logit_bias: dict[Any, float] | None, min_p: float | None) -> bool:
    """Whether vLLM's check refuses these parameters on an engine with a drafter."""
    return bool(logit_bias) or (min_p is not None and min_p > SAMPLING_EPS)
