"""What `spec-gateway serve` resolves on a GPU, assembled on vLLM 0.33.0 without one.

The chart's production pod (tests/cuda/production.py: helm/spec-gateway rendered with
ci/production-values.yaml, its container's command, environment and mounts replayed)
with a Llama-3.1-8B-Instruct-shaped target and an EAGLE-3 head shaped like
`yuhuili/EAGLE3-LLaMA3.1-Instruct-8B` (tests/cuda/llama31.py: their config.json,
tokenizer and chat template, no weights) is resolved into the engine arguments the
engine starts with (`checked_engine_args`) and 0.33's `VllmConfig`, on vLLM's own CUDA
platform; the scheduler class vLLM's engine core would build is built on that config.
test_assembled_serving.py serves the same pod end to end.

Stood in, and why (nothing else is): the device. vLLM's CUDA platform class answers its
NVML queries as H100s would, loads its kernel libraries against a driver library that
reports no device, and the config counts Triton's GPU driver as active
(tests/cuda/h100.py): there is no GPU here. The Secrets the pod reads its keys from are
stood in too (tests/cuda/production.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from vllm.config import CompilationMode, CUDAGraphMode
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.structured_output import StructuredOutputManager

from engine.vllm.batch_depth import BatchDepthPolicy
from engine.vllm.engine_args import checked_engine_args, engine_args
from engine.vllm.parsers import resolved_parsers
from engine.vllm.plan import cuda_plan, render, startup_plan
from engine.vllm.preflight import preflight
from engine.vllm.scheduler import AsyncSpecDepthScheduler, AutoSpecDepthScheduler
from tests.cuda.h100 import CAPABILITY, NAME, cuda_platform
from tests.cuda.production import ProductionPod, production_pod

#: Llama-3.1-8B-Instruct's config.json.
MODEL_LENGTH, VOCAB = 131072, 128256


@pytest.fixture(scope="module")
def pod(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProductionPod]:
    with pytest.MonkeyPatch.context() as patch:
        yield production_pod(tmp_path_factory.mktemp("pod"), patch)


def test_on_the_cpu_platform_the_same_pod_runs_eager(pod: ProductionPod) -> None:
    """The control: without the CUDA platform the same settings decide the other way,
    so what the tests above see is the platform's decision, not the settings'."""
    from vllm.platforms import current_platform

    assert not current_platform.is_cuda()
    config = engine_args(pod.settings.engine).create_engine_config()
    assert config.model_config.enforce_eager is True
    assert config.compilation_config.cudagraph_mode == CUDAGraphMode.NONE
    assert config.scheduler_config.async_scheduling is False


def test_the_start_up_plan_for_the_production_pod(pod: ProductionPod) -> None:
    """`spec-gateway plan` for the chart's production values, printed here without a GPU
    (`pytest -s` shows it): graphs, every width, V2, async, llama3_json, the model id."""
    plan = startup_plan(pod.settings.engine, None, pod.environ)
    text = render(plan, 80.0)
    print(text)
    cuda = text[text.index("[CUDA") :]
    assert "torch.compile + CUDA graphs (cudagraph_mode FULL_AND_PIECEWISE)" in cuda
    assert "model runner V2, async scheduling on" in cuda
    assert "batch-depth rule: uniform; step depths: 0, 1, 2, 3, 4" in cuda
    for k in range(pod.settings.engine.max_depth + 1):
        assert f"k={k} (width {k + 1}) to batch" in cuda
    assert "tool-call parser: llama3_json  reasoning parser: none" in text
    assert f"served model names: {pod.settings.served_names[0]}" in text


@pytest.fixture(scope="module")
def h100(pod: ProductionPod, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """vLLM's CUDA platform on as many H100s as the pod requests, for the module."""
    with cuda_platform(pod.gpus, tmp_path_factory.mktemp("driver")) as platform:
        yield platform


@pytest.fixture(scope="module")
def args(pod: ProductionPod, h100: Any) -> AsyncEngineArgs:
    return checked_engine_args(pod.settings.engine)


@pytest.fixture(scope="module")
def config(args: AsyncEngineArgs) -> Any:
    return args.create_engine_config()


def test_the_pod_serves_the_chart_models_under_the_configured_name(pod: ProductionPod) -> None:
    engine = pod.settings.engine
    models = pod.values["models"]
    assert (engine.model, engine.drafter) == (pod.models.target, pod.models.drafter)
    assert engine.model is not None
    assert engine.model.name == models["targetDir"]
    assert pod.settings.host == "0.0.0.0"
    assert pod.settings.api_keys
    assert pod.gpus >= 1
    assert engine.tensor_parallel_size == pod.gpus
    assert engine.max_depth == pod.values["engine"]["maxDepth"]
    configured = pod.values.get("gateway", {}).get("config", {}).get("served_model_name")
    assert pod.settings.served_names[0] == (configured or str(engine.model))


def test_the_llama_31_template_picks_the_llama3_json_tool_parser(pod: ProductionPod) -> None:
    parsers = resolved_parsers(pod.settings.engine, {})
    assert (parsers.tool_call, parsers.reasoning) == ("llama3_json", None)


def test_the_platform_is_cuda_on_h100s(pod: ProductionPod, h100: Any) -> None:
    from vllm.platforms import current_platform

    assert current_platform is h100
    assert current_platform.is_cuda()
    assert current_platform.get_device_capability().as_version_str() == "{}.{}".format(*CAPABILITY)
    assert current_platform.get_device_name() == NAME
    assert current_platform.device_count() == pod.gpus
    assert torch.bfloat16 in current_platform.supported_dtypes


def test_preflight_passes_on_cuda(pod: ProductionPod, h100: Any) -> None:
    preflight(pod.settings.engine)


def test_the_engine_arguments_ask_for_graphs_and_the_capture_schedule(
    pod: ProductionPod, args: AsyncEngineArgs
) -> None:
    k = pod.settings.engine.max_depth
    assert args.enforce_eager is False  # null = by platform: graphs on CUDA
    assert args.async_scheduling is None  # vLLM decides; the scheduler class follows
    assert args.scheduler_cls == "engine.vllm.scheduler.AutoSpecDepthScheduler"
    assert args.speculative_config is not None
    spec = args.speculative_config
    assert (spec["method"], spec["num_speculative_tokens"]) == ("eagle3", k)
    assert spec["model"] == str(pod.models.drafter)
    schedule = spec["num_speculative_tokens_per_batch_size"]
    assert {row[2] for row in schedule} == set(range(k + 1))  # every width 1 + k captured
    assert args.served_model_name == pod.settings.served_names


def test_vllm_runs_v2_async_compiled_with_full_and_piecewise_graphs(
    pod: ProductionPod, config: Any
) -> None:
    assert config.use_v2_model_runner is True
    assert config.scheduler_config.async_scheduling is True
    assert config.max_concurrent_batches == 2  # the batch queue: one step in flight
    compilation = config.compilation_config
    assert compilation.mode == CompilationMode.VLLM_COMPILE
    assert compilation.cudagraph_mode == CUDAGraphMode.FULL_AND_PIECEWISE
    assert config.model_config.enforce_eager is False
    assert config.parallel_config.worker_cls == "vllm.v1.worker.gpu_worker.Worker"
    assert config.parallel_config.tensor_parallel_size == pod.gpus


def test_every_decode_width_is_captured_up_to_the_ceiling(pod: ProductionPod, config: Any) -> None:
    k = pod.settings.engine.max_depth
    sizes = config.compilation_config.cudagraph_capture_sizes
    assert sizes
    assert max(sizes) == config.compilation_config.max_cudagraph_capture_size <= 512
    for width in range(1, k + 2):  # a lone request at every depth 0..K
        assert width in sizes, (width, sizes)


def test_the_model_is_read_as_llama_31_8b_with_its_eagle3_head(
    pod: ProductionPod, config: Any
) -> None:
    model = config.model_config
    assert model.architecture == "LlamaForCausalLM"
    assert model.get_vocab_size() == VOCAB
    assert model.get_hidden_size() == 4096
    assert model.max_model_len == (pod.settings.engine.max_model_len or MODEL_LENGTH)
    assert model.dtype == torch.bfloat16
    spec = config.speculative_config
    draft = spec.draft_model_config
    assert (spec.method, spec.num_speculative_tokens) == ("eagle3", pod.settings.engine.max_depth)
    assert draft.architecture == "LlamaForCausalLMEagle3"
    assert draft.hf_config.draft_vocab_size == 32000
    # The head's rotary cache is lifted from its 2048 positions to the target's length.
    assert draft.hf_config.max_position_embeddings == model.max_model_len


def test_the_plans_cuda_column_is_what_vllm_resolves_on_cuda(
    pod: ProductionPod, config: Any
) -> None:
    """`engine.vllm.plan` writes vLLM 0.33's CUDA decisions out to plan without a GPU;
    here they are set against the `VllmConfig` vLLM builds on its CUDA platform."""
    from engine.vllm.batch_depth import rule_for
    from engine.vllm.model_source import model_source, read_config

    engine = pod.settings.engine
    target = read_config(model_source(pod.models.target, "target"), None)
    drafter = read_config(model_source(pod.models.drafter, "drafter"), None)
    planned = cuda_plan(engine, target, drafter, 80.0)
    rows = config.speculative_config.num_speculative_tokens_per_batch_size or []
    real = rule_for(config, "cuda", {int(row[2]) for row in rows})
    assert planned.eager is config.model_config.enforce_eager
    assert planned.cudagraph_mode == config.compilation_config.cudagraph_mode.name
    assert planned.async_scheduling is config.scheduler_config.async_scheduling
    assert config.use_v2_model_runner
    assert planned.max_num_seqs == config.scheduler_config.max_num_seqs
    assert planned.max_model_len == config.model_config.max_model_len
    assert planned.policy is real.policy
    assert {d: b for d, b in planned.full_batch.items() if d > 0} == real.full_batch


def test_the_engine_core_builds_the_gateways_async_scheduler(
    pod: ProductionPod, config: Any
) -> None:
    """The class vLLM's `EngineCore` instantiates from `scheduler_cls`, on this config."""
    assert config.scheduler_config.get_scheduler_cls() is AutoSpecDepthScheduler
    config.cache_config.num_gpu_blocks = 4096  # what profiling the GPU's memory would set
    block = config.cache_config.block_size
    layer = FullAttentionSpec(block_size=block, num_kv_heads=8, head_size=128, dtype=torch.bfloat16)
    kv = KVCacheConfig(
        num_blocks=4096, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer"], layer)]
    )
    scheduler = AutoSpecDepthScheduler(
        vllm_config=config,
        kv_cache_config=kv,
        structured_output_manager=StructuredOutputManager(config),
        block_size=block,
        log_stats=True,
    )
    assert isinstance(scheduler, AsyncSpecDepthScheduler)
    assert isinstance(scheduler, AsyncScheduler)
    rule = scheduler.specgw_depth_rule
    k = pod.settings.engine.max_depth
    assert rule.policy is BatchDepthPolicy.UNIFORM
    assert rule.captured == tuple(range(1, k + 1))
