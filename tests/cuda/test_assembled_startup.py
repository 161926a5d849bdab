"""What `spec-gateway serve` builds on a GPU, assembled on vLLM 0.33.0 without one.

The chart's production pod (tests/cuda/production.py: helm/spec-gateway rendered with
ci/production-values.yaml, its container's command, environment and mounts replayed)
with a Llama-3.1-8B-Instruct-shaped target and an EAGLE-3 head shaped like
`yuhuili/EAGLE3-LLaMA3.1-Instruct-8B` (tests/cuda/llama31.py: their config.json,
tokenizer and chat template, no weights) is resolved into the engine arguments the
engine starts with (`checked_engine_args`) and 0.33's `VllmConfig`, on vLLM's own CUDA
platform, then served end to end: the gateway's HTTP app (`create_app` with the
production runtime factory) on 0.33's whole OpenAI serving layer (`OpenAIFrontend.create`:
chat, completions, responses, models, the tool and reasoning parsers), driven by the
official `openai` client.

Stood in, and why (nothing else is):
* the device: vLLM's CUDA platform class answers its NVML queries as H100s would, loads
  its kernel libraries against a driver library that reports no device, and Triton's
  GPU driver counts as active (tests/cuda/h100.py): there is no GPU here;
* the engine core, which on a GPU runs the model: it emits scripted token ids
  (tests/cuda/scripted_engine.py; the renderer, input and output processing around it
  are vLLM's own, wired as `AsyncLLM` wires them): there are no weights here;
* the Secrets the pod reads its keys from, and for the served gateway the services it
  reaches over the network (Redis, the OpenTelemetry collector): none run here.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
import torch
from fastapi import FastAPI
from openai.types.chat import ChatCompletionFunctionToolParam
from vllm.config import CompilationMode, CUDAGraphMode
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

import gateway.plugins
from engine.interface import GATEWAY_ID_ARG
from engine.step_rule import SPEC_COSTS_ARG, SPEC_VOTE_ARG, StepCostTable, StepVote
from engine.vllm.batch_depth import BatchDepthPolicy
from engine.vllm.engine_args import checked_engine_args, engine_args
from engine.vllm.openai_frontend import OpenAIFrontend
from engine.vllm.parsers import resolved_parsers
from engine.vllm.preflight import preflight
from engine.vllm.scheduler import (
    AsyncSpecDepthScheduler,
    AutoSpecDepthScheduler,
    requested_depth,
)
from gateway.app import create_app
from gateway.runtime import Runtime, real_runtime_factory
from tests.cuda.h100 import CAPABILITY, NAME, cuda_platform
from tests.cuda.llama31 import END_OF_TEXT, EOM, EOT, special_tokens
from tests.cuda.production import USER_KEY, ProductionPod, production_pod
from tests.cuda.scripted_engine import ScriptedEngineClient

BASE_URL = "http://gateway.test"
#: The backend name the scripted-core backend is plugged in under (`gateway.plugins`).
SCRIPTED = "vllm-scripted-core"
#: Set on the served pod through the chart's `gateway.extraEnv`: start-up calibration at
#: three batch sizes, not every power of two to `max_running` (15 s of scripted steps,
#: whose times are no GPU's anyway).
SERVED_ENV = {"SPECGW_CONTROL_CALIBRATE_BATCHES": "[1, 2, 4]"}
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


@dataclass
class Served:
    """The gateway app started on the scripted engine core, and a client on it."""

    app: FastAPI
    http: httpx.AsyncClient
    pod: ProductionPod

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    @property
    def core(self) -> ScriptedEngineClient:
        client: ScriptedEngineClient = self.runtime.engine.llm  # type: ignore[attr-defined]
        return client

    @property
    def model(self) -> str:
        return self.pod.settings.served_names[0]

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{BASE_URL}/v1",
            api_key=USER_KEY,
            http_client=self.http,  # type: ignore[arg-type]  # openai types httpx2's client
            max_retries=0,
        )

    def prompt(self, index: int = -1) -> str:
        """The prompt the engine core was given (special tokens as text)."""
        ids = self.core.requests[index].prompt_token_ids or []
        text: str = self.core.tokenizer.decode(ids, skip_special_tokens=False)
        return text


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def served(tmp_path_factory: pytest.TempPathFactory, h100: Any) -> AsyncIterator[Served]:
    with pytest.MonkeyPatch.context() as patch:
        pod = production_pod(
            tmp_path_factory.mktemp("served"),
            patch,
            external_services=False,
            extra_env=SERVED_ENV,
        )
        patch.setitem(gateway.plugins.PLUGINS, SCRIPTED, "tests.cuda.scripted_engine:BACKEND")
        settings = pod.settings
        factory = real_runtime_factory(settings.engine, settings.control, backend=SCRIPTED)
        app = create_app(settings, factory)
        transport = httpx.ASGITransport(app=app)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url=BASE_URL) as http,
        ):
            yield Served(app, http, pod)


async def test_the_gateway_is_ready_with_the_step_rule_on(served: Served) -> None:
    ready = await served.http.get("/ready")
    assert ready.status_code == 200, ready.text
    assert served.runtime.engine.one_depth_per_step is True  # uniform depth on CUDA graphs
    assert served.runtime.plane.step_rule is True


async def test_models_lists_the_served_name(served: Served) -> None:
    listed = await served.client().models.list()
    assert [m.id for m in listed.data] == [served.model]


async def test_the_port_is_vllms_whole_serving_layer_with_llama3_json(served: Served) -> None:
    frontend = served.runtime.frontend
    assert isinstance(frontend, OpenAIFrontend)
    state = frontend._state
    assert isinstance(state.openai_serving_chat, OpenAIServingChat)
    assert isinstance(state.openai_serving_completion, OpenAIServingCompletion)
    assert isinstance(state.openai_serving_responses, OpenAIServingResponses)
    assert isinstance(state.openai_serving_models, OpenAIServingModels)
    # The chat serving's parser, and the renderer's (which Responses renders through).
    for parser in (state.openai_serving_chat.parser_cls, state.online_renderer.parser):
        assert parser is not None
        assert parser.tool_parser_cls is Llama3JsonToolParser
        assert parser.reasoning_parser_cls is None
    assert state.args.served_model_name == served.pod.settings.served_names
    assert state.vllm_config is served.core.vllm_config
    assert state.vllm_config.use_v2_model_runner  # the CUDA platform's config, served


async def test_a_chat_completion_runs_through_the_llama_template(served: Served) -> None:
    served.core.replies.append("The json module encodes and decodes JSON.")
    reply = await served.client().chat.completions.create(
        model=served.model,
        messages=[
            {"role": "system", "content": "You are a helpful Python assistant."},
            {"role": "user", "content": "What does the json module do?"},
        ],
        max_tokens=64,
        temperature=0,
    )
    choice = reply.choices[0]
    assert choice.message.content == "The json module encodes and decodes JSON."
    assert choice.finish_reason == "stop"
    assert reply.model == served.model
    prompt = served.prompt()
    assert prompt.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>")
    assert "You are a helpful Python assistant.<|eot_id|>" in prompt
    assert prompt.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    request = served.core.requests[-1]
    assert reply.usage is not None
    assert request.prompt_token_ids is not None
    assert reply.usage.prompt_tokens == len(request.prompt_token_ids)
    params = request.sampling_params
    assert params is not None
    names = special_tokens()
    stops = {params.eos_token_id, *(params.stop_token_ids or ())}
    assert {names[i] for i in stops} == {EOT, EOM, END_OF_TEXT}  # generation_config.json
    # What the control plane sends reaches vLLM's scheduler through 0.33's serving layer
    # (`vllm_xargs` -> `SamplingParams.extra_args`): under the step rule, the class's vote
    # and the step costs, and a k the step's depth may reach (at most K).
    extra = params.extra_args
    assert extra is not None
    assert StepVote.from_arg(extra[SPEC_VOTE_ARG]) is not None
    assert StepCostTable.from_arg(extra[SPEC_COSTS_ARG]) is not None
    k_max = served.pod.settings.engine.max_depth
    assert requested_depth(Request.from_engine_core_request(request, None), k_max) == k_max
    assert extra[GATEWAY_ID_ARG] in request.request_id  # the id the outcome tap files by


WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


async def test_a_streamed_tool_call_reaches_the_client_as_tool_calls(served: Served) -> None:
    """Llama 3.1 answers a custom tool as the template asks: bare JSON, then <|eot_id|>."""
    served.core.replies.append('{"name": "get_weather", "parameters": {"city": "Paris"}}')
    stream = await served.client().chat.completions.create(
        model=served.model,
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        stream=True,
        temperature=0,
    )
    names, arguments, content, finish = [], "", "", None
    async for chunk in stream:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            for call in delta.tool_calls or []:
                if call.function and call.function.name:
                    names.append(call.function.name)
                arguments += (call.function.arguments or "") if call.function else ""
            finish = choice.finish_reason or finish
    assert names == ["get_weather"]
    assert json.loads(arguments) == {"city": "Paris"}
    assert content.strip() == ""
    assert finish == "tool_calls"
    prompt = served.prompt()
    assert "Environment: ipython" in prompt
    assert '"name": "get_weather"' in prompt  # the tool, rendered by the template


async def test_a_responses_request_answers(served: Served) -> None:
    served.core.replies.append("Rivers carve valleys over time.")
    response = await served.client().responses.create(
        model=served.model, input="How do rivers shape valleys?", max_output_tokens=32
    )
    assert response.status == "completed"
    assert response.output_text == "Rivers carve valleys over time."
    assert "How do rivers shape valleys?<|eot_id|>" in served.prompt()


async def test_a_completion_answers_at_max_tokens(served: Served) -> None:
    served.core.replies.append("one two three four five six")
    reply = await served.client().completions.create(
        model=served.model, prompt="Count:", max_tokens=3, temperature=0
    )
    assert reply.choices[0].finish_reason == "length"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 3
    assert served.prompt().startswith("<|begin_of_text|>Count:")
