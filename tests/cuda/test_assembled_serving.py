"""The chart's production pod served end to end on vLLM 0.33.0, without a GPU.

The pod of test_assembled_startup.py (tests/cuda/production.py), on vLLM's CUDA platform
answering as H100s (tests/cuda/h100.py), started as `spec-gateway serve` starts it: the
gateway's HTTP app (`create_app`, the production runtime factory `runtime_factory`
on the vLLM backend, its serving port `OpenAIFrontend.create`: 0.33's whole OpenAI serving
layer, chat, completions, responses, models, the tool and reasoning parsers chosen from
the model), driven by the official `openai` client through `httpx.ASGITransport`.

Stood in, and why (nothing else is):
* the device, as in test_assembled_startup.py: there is no GPU here;
* the engine core, which on a GPU runs the model: it emits scripted token ids
  (tests/cuda/scripted_engine.py; the renderer, input and output processing around it
  are vLLM's own, wired as `AsyncLLM` wires them): there are no weights here;
* the pod's Secrets, and the services it reaches over the network (Redis, the
  OpenTelemetry collector), left out: none run here.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import openai
import pytest
import pytest_asyncio
from fastapi import FastAPI
from openai.types.chat import ChatCompletionFunctionToolParam
from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
from vllm.entrypoints.openai.models.serving import OpenAIServingModels
from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
from vllm.tool_parsers.llama_tool_parser import Llama3JsonToolParser
from vllm.v1.request import Request

from engine.interface import GATEWAY_ID_ARG
from engine.step_rule import SPEC_COSTS_ARG, SPEC_VOTE_ARG, StepCostTable, StepVote
from engine.vllm.openai_frontend import OpenAIFrontend
from engine.vllm.scheduler import requested_depth
from gateway.app import create_app
from gateway.runtime import Runtime, runtime_factory
from tests.cuda.h100 import cuda_platform
from tests.cuda.llama31 import END_OF_TEXT, EOM, EOT, special_tokens
from tests.cuda.production import USER_KEY, ProductionPod, production_pod
from tests.cuda.scripted_engine import BACKEND as SCRIPTED
from tests.cuda.scripted_engine import ScriptedEngineClient

BASE_URL = "http://gateway.test"
#: Set on the served pod through the chart's `gateway.extraEnv`: start-up calibration at
#: three batch sizes, not every power of two to `max_running` (15 s of scripted steps,
#: whose times are no GPU's anyway).
SERVED_ENV = {"SPECGW_CONTROL_CALIBRATE_BATCHES": "[1, 2, 4]"}


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
async def served(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Served]:
    with pytest.MonkeyPatch.context() as patch:
        pod = production_pod(
            tmp_path_factory.mktemp("served"),
            patch,
            external_services=False,
            extra_env=SERVED_ENV,
        )
        settings = pod.settings
        factory = runtime_factory(settings.engine, settings.control, backend=SCRIPTED)
        app = create_app(settings, factory)
        transport = httpx.ASGITransport(app=app)
        with cuda_platform(pod.gpus, tmp_path_factory.mktemp("driver")):
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
