"""The worker-side hooks against vLLM 0.33's model runners, and the vLLM code the CUDA
batch-depth rule rests on (`engine/README.md`): if a later vLLM moves any of it, this
tier fails before a GPU user finds out.

Runner instances are made with `object.__new__` (no GPU, no model): the hooks read and
wrap methods only, and their install must work on the real classes.
"""

from __future__ import annotations

import functools
import inspect
from types import SimpleNamespace
from typing import Any

import torch
from vllm.v1.worker.gpu.model_runner import GPUModelRunner as RunnerV2
from vllm.v1.worker.gpu.spec_decode.eagle.speculator import EagleSpeculator as Speculator
from vllm.v1.worker.gpu_model_runner import GPUModelRunner as RunnerV1

from engine.vllm.compat import resolve
from engine.vllm.draft_skip import (
    DRAFTER_IDLE,
    DraftSkipExtension,
    runner_supports_skip,
    v2_runner_supports_skip,
)
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


def _v2_runner(**config: Any) -> tuple[Any, Any, list[dict[str, Any]]]:
    """A bare V2 runner with a bare EAGLE speculator whose real methods are stood in for
    by recorders of the same signatures (no GPU: the real ones would launch kernels)."""
    speculator = object.__new__(Speculator)
    speculator.draft_tokens = torch.arange(12, dtype=torch.int64).reshape(4, 3)
    calls: list[dict[str, Any]] = []

    @functools.wraps(Speculator.propose.__get__(speculator))
    def propose(*args: Any, **kwargs: Any) -> str:
        calls.append({"propose": kwargs.get("num_speculative_tokens")})
        return "drafted"

    @functools.wraps(RunnerV2.execute_model.__get__(object.__new__(RunnerV2)))
    def execute_model(*args: Any, **kwargs: Any) -> None:
        calls.append({"execute": args[0].num_spec_tokens_to_schedule})

    speculator.propose = propose
    parallel = SimpleNamespace(
        data_parallel_size=1, pipeline_parallel_size=1, prefill_context_parallel_size=1
    )
    for name, value in config.items():
        setattr(parallel, name, value)
    runner = _bare(
        RunnerV2,
        speculative_config=object(),
        speculator=speculator,
        pcp_manager=None,
        adaptive_verification=None,
        vllm_config=SimpleNamespace(parallel_config=parallel, speculative_config=None),
        execute_model=execute_model,
    )
    return runner, speculator, calls


def _step(runner: Any, speculator: Any, depth: int, idle: bool, **kwargs: Any) -> Any:
    """One step as V2 runs it: `execute_model`, then `sample_tokens`' call to `propose`."""
    output = SimpleNamespace(num_spec_tokens_to_schedule=depth)
    setattr(output, DRAFTER_IDLE, idle)
    runner.execute_model(output)
    batch = SimpleNamespace(num_reqs=2)
    return speculator.propose(batch, num_speculative_tokens=depth, **kwargs)


def test_v2_runner_skips_its_drafter_where_no_request_drafts() -> None:
    """In a step the scheduler marks `DRAFTER_IDLE`, `propose` returns what V2's own
    returns for zero drafts (its draft buffer's rows, all -1) without running the
    drafter; a depth-0 step not so marked (voters held at 0), any other depth and a
    dummy run run the drafter as before."""
    runner, speculator, calls = _v2_runner()
    assert v2_runner_supports_skip(runner)
    worker = _Worker(runner)
    assert worker.specgw_install_draft_skip() is True
    assert worker.specgw_install_draft_skip() is False  # once per runner

    assert _step(runner, speculator, 3, idle=False) == "drafted"
    drafts = _step(runner, speculator, 0, idle=True)
    assert drafts.tolist() == [[-1, -1, -1], [-1, -1, -1]]
    assert speculator.draft_tokens[2:].tolist() == [[6, 7, 8], [9, 10, 11]]  # rows beyond
    assert _step(runner, speculator, 0, idle=False) == "drafted"  # held: KV pass stays
    assert _step(runner, speculator, 0, idle=True, dummy_run=True) == "drafted"
    assert _step(runner, speculator, 1, idle=False) == "drafted"
    assert worker.specgw_draft_skips() == 1
    assert calls == [
        {"execute": 3},
        {"propose": 3},
        {"execute": 0},
        {"execute": 0},
        {"propose": 0},
        {"execute": 0},
        {"propose": 0},
        {"execute": 1},
        {"propose": 1},
    ]


def test_v2_runner_keeps_its_drafter_where_the_config_needs_it() -> None:
    """Data or pipeline parallel ranks, prefill context parallelism and adaptive
    verification need every step's proposal (`draft_skip.v2_skip_allowed`): no skip, and
    the engine reports it (`VLLMEngine.draft_skip`), never a half-installed wrapper."""
    for config in (
        {"data_parallel_size": 2},
        {"pipeline_parallel_size": 2},
        {"prefill_context_parallel_size": 2},
    ):
        runner, _, _ = _v2_runner(**config)
        assert _Worker(runner).specgw_install_draft_skip() is False, config
        assert not hasattr(runner, "_specgw_draft_skip")
    runner, _, _ = _v2_runner()
    runner.adaptive_verification = object()
    assert _Worker(runner).specgw_install_draft_skip() is False
    runner, _, _ = _v2_runner()
    runner.speculator = None  # a pipeline stage before the last has no speculator
    assert _Worker(runner).specgw_install_draft_skip() is False


def test_v2_skip_rests_on_what_its_runner_does_with_zero_drafts() -> None:
    """What the V2 skip relies on, read in vLLM 0.33: the step's depth reaches `propose`
    after vLLM's own `skip_drafts` has zeroed it (so the scheduler's depth must be read at
    `execute_model`), `propose` at depth 0 still runs the drafter's prefill and returns
    its -1-filled buffer, and `sample_tokens` uses no draft beyond the step's depth."""
    execute = inspect.getsource(RunnerV2.execute_model)
    assert "0 if skip_drafts else scheduler_output.num_spec_tokens_to_schedule" in execute
    assert "self.execute_model_state = ExecuteModelState(" in execute
    sample = inspect.getsource(RunnerV2.sample_tokens)
    assert "self.speculator.propose(" in sample
    assert "num_speculative_tokens=num_spec_tokens" in sample
    assert "draft_tokens[:, :num_spec_tokens]" in sample
    propose = inspect.getsource(Speculator.propose)
    assert "skip_sample=num_speculative_tokens == 0" in propose
    assert "self.draft_tokens[:num_reqs].fill_(-1)" in propose
    assert "return self.draft_tokens[:num_reqs]" in propose


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
        "specgw_install_draft_confidence",
        "specgw_remove_draft_confidence",
        "specgw_draft_confidence_records",
        "specgw_draft_confidences",
        "specgw_draft_confidence_mismatches",
        "specgw_install_class_verification",
        "specgw_class_verification",
    }
    assert not ours & set(dir(worker_cls))
