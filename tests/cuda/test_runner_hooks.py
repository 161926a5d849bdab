"""The worker-side hooks against vLLM 0.33's model runners, and the vLLM code the CUDA
batch-depth rule rests on (`engine/README.md`): if a later vLLM moves any of it, this
tier fails before a GPU user finds out.

Runner instances are made with `object.__new__` (no GPU, no model): the hooks read and
wrap methods only, and their install must work on the real classes.
"""

from __future__ import annotations

import inspect
from typing import Any

from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2
from vllm.v1.worker.gpu_model_runner import GPUModelRunner as RunnerV1

from engine.vllm.compat import resolve
from engine.vllm.draft_skip import DraftSkipExtension, runner_supports_skip
from engine.vllm.worker import SpecGatewayWorker


class _Worker(DraftSkipExtension):
    """A worker as vLLM's extension mechanism makes it: the extension's methods on it."""

    def __init__(self, runner: Any) -> None:
        self.model_runner = runner


def _bare(cls: type[Any], **attrs: Any) -> Any:
    runner = object.__new__(cls)
    for name, value in attrs.items():
        setattr(runner, name, value)
    return runner


def test_v1_runner_takes_the_depth_zero_skip() -> None:
    runner = _bare(RunnerV1, speculative_config=object(), use_async_scheduling=True)
    assert runner_supports_skip(runner)
    worker = _Worker(runner)
    assert worker.specgw_install_draft_skip() is True
    assert worker.specgw_install_draft_skip() is False  # once per runner
    assert worker.specgw_draft_skips() == 0
    wrapped = inspect.signature(runner._input_fits_in_drafter)
    assert list(wrapped.parameters) == ["common_attn_metadata"]


def test_v2_runner_has_no_skip_hook_so_none_is_installed() -> None:
    """Model Runner V2 runs the drafter's KV pass in every step: the skip stays off, and
    the engine reports it (`VLLMEngine.draft_skip`), never a half-installed wrapper."""
    runner = _bare(RunnerV2, speculative_config=object())
    assert not runner_supports_skip(runner)
    assert _Worker(runner).specgw_install_draft_skip() is False
    assert not hasattr(runner, "_specgw_draft_skip")


def test_v2_passes_the_steps_depth_to_its_drafter() -> None:
    """The step depth the scheduler sets reaches V2's drafter (and 0 skips its draft steps)."""
    execute = inspect.getsource(RunnerV2.execute_model)
    assert "scheduler_output.num_spec_tokens_to_schedule" in execute
    propose = resolve(
        "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.speculator:"
        "TargetDependentARSpeculator.propose"
    )
    assert "num_speculative_tokens" in inspect.signature(propose).parameters
    assert "if num_speculative_tokens <= 1:" in inspect.getsource(propose)


def test_full_decode_graphs_need_one_captured_width() -> None:
    """The basis of the uniform rule (`engine.vllm.batch_depth`), read in vLLM 0.33."""
    uniform = inspect.getsource(resolve("vllm.v1.worker.utils:get_uniform_decode_token_count"))
    assert "is_uniform_query_len" in uniform
    manager = "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager"
    assert "decode_query_lens" in inspect.getsource(resolve(f"{manager}._init_candidates"))
    assert "uniform_token_count" in inspect.getsource(
        resolve("vllm.v1.worker.gpu.cudagraph_utils:_is_compatible")
    )
    drafter = (
        "vllm.v1.worker.gpu.spec_decode.target_dependent_ar.cudagraph_utils:"
        "SpeculatorCudaGraphManager.specialize_spec_tokens"
    )
    assert "CUDAGraphMode.NONE" in inspect.getsource(resolve(drafter))
    v1 = inspect.getsource(resolve("vllm.v1.cudagraph_dispatcher:CudagraphDispatcher.__init__"))
    assert "self.uniform_decode_query_len = 1 + self.vllm_config.num_speculative_tokens" in v1
    schedule = inspect.getsource(resolve("vllm.v1.core.sched.scheduler:Scheduler.schedule"))
    assert "preserve full cudagraph" in schedule


def test_the_worker_extension_mixes_in_without_clashing() -> None:
    """vLLM mixes `worker_extension_cls` into its worker and refuses clashing names."""
    wrapper = inspect.getsource(resolve("vllm.v1.worker.worker_base:WorkerWrapperBase"))
    assert "worker_extension_cls" in wrapper
    worker_cls = resolve("vllm.v1.worker.gpu_worker:Worker")
    ours = {name for name in vars(SpecGatewayWorker) if name.startswith("specgw_")}
    for base in SpecGatewayWorker.__mro__:
        ours |= {name for name in vars(base) if name.startswith("specgw_")}
    assert ours == {
        "specgw_install_draft_skip",
        "specgw_draft_skips",
        "specgw_fix_expand",
        "specgw_install_depth_zero_params",
    }
    assert not ours & set(dir(worker_cls))
