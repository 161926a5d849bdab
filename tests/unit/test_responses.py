"""`/v1/responses` through the official client's `responses.create`, the whole gateway in
process on the fake backend: plain, streamed, with a function tool, and what it refuses."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine.fake_responses import responses_prompt
from engine.protocol import ResponsesRequest
from tests.spec_report import check_report
from tests.unit.conftest import (
    MESSAGES,
    MODEL,
    USER_KEY,
    InProcessGateway,
    gateway_settings,
    serve_in_process,
)
from tests.unit.test_stream_failures import CountedSteps, when_streaming

pytestmark = pytest.mark.asyncio(loop_scope="session")

INSTRUCTIONS = "You are a helpful Python assistant."
QUESTION = "What does the json module do?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"],
    },
}


def expected_text(gw: InProcessGateway, body: dict[str, Any], tokens: int) -> str:
    """What the fake model says to this request: a function of its prompt."""
    prompt = responses_prompt(ResponsesRequest.model_validate({"model": MODEL, **body}))
    return "".join(f" t{gw.engine.token_at(prompt, i)}" for i in range(tokens))


async def test_a_plain_response_with_headers_and_speculation(gateway: InProcessGateway) -> None:
    body = {"instructions": INSTRUCTIONS, "input": QUESTION}
    raw = await gateway.client().responses.with_raw_response.create(
        model=MODEL, max_output_tokens=12, temperature=0, **body
    )
    response = raw.parse()
    k = int(raw.headers["x-specgw-k"])
    label = raw.headers["x-specgw-class"]
    assert label.startswith("chat/")
    assert raw.headers["x-request-id"]
    assert response.id.startswith("resp_")
    assert response.model == MODEL
    assert response.instructions == INSTRUCTIONS
    assert response.output_text == expected_text(gateway, body, 12)
    # The output stopped at max_output_tokens: vLLM's (and OpenAI's) `incomplete`.
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None
    assert response.usage.output_tokens == 12
    check_report(response.model_extra, k, label)


async def test_its_inference_span_is_a_chat_span_with_its_sampling(
    gateway: InProcessGateway,
) -> None:
    """OpenTelemetry's GenAI conventions have no Responses operation: it is `chat`, with
    `max_output_tokens` as the request's max tokens."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gateway.runtime.service.trace_with(provider.get_tracer("test"))
    response = await gateway.client().responses.create(
        model=MODEL, input=QUESTION, max_output_tokens=6, temperature=0.0, top_p=0.5
    )
    (span,) = exporter.get_finished_spans()
    attrs = dict(span.attributes or {})
    assert span.name == f"chat {MODEL}"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.response.id"] == response.id
    assert attrs["gen_ai.request.max_tokens"] == 6
    assert attrs["gen_ai.request.temperature"] == 0.0
    assert attrs["gen_ai.request.top_p"] == 0.5
    assert attrs["gen_ai.usage.output_tokens"] == 6
    assert attrs["specgw.k"] == response.model_extra["speculation"]["k"]  # type: ignore[index]
    provider.shutdown()


async def test_it_is_classified_as_the_chat_request_it_renders_to(
    gateway: InProcessGateway,
) -> None:
    """Instructions + input messages land in the class of the same system + user chat."""
    client = gateway.client()
    chat = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0
    )
    as_string = await client.responses.with_raw_response.create(
        model=MODEL, instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=4, temperature=0
    )
    as_messages = await client.responses.with_raw_response.create(
        model=MODEL, input=MESSAGES, max_output_tokens=4, temperature=0, store=False
    )
    labels = {r.headers["x-specgw-class"] for r in (chat, as_string, as_messages)}
    assert len(labels) == 1, labels
    response = as_messages.parse()
    assert response.output_text == expected_text(gateway, {"input": MESSAGES}, 4)


async def test_a_streamed_response_ends_with_completed_and_speculation(
    gateway: InProcessGateway,
) -> None:
    body = {"instructions": INSTRUCTIONS, "input": QUESTION}
    raw = await gateway.client().responses.with_raw_response.create(
        model=MODEL, max_output_tokens=10, temperature=0, stream=True, **body
    )
    k = int(raw.headers["x-specgw-k"])
    label = raw.headers["x-specgw-class"]
    events = [event async for event in raw.parse()]
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == expected_text(gateway, body, 10)
    final = events[-1].response
    assert final.output_text == deltas
    assert final.usage is not None
    assert final.usage.output_tokens == 10
    check_report(final.model_extra, k, label)


async def test_a_function_tool_is_called(gateway: InProcessGateway) -> None:
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    raw = await gateway.client().responses.with_raw_response.create(
        model=MODEL, input=ask, tools=[WEATHER], tool_choice="required", max_output_tokens=8
    )
    response = raw.parse()
    (call,) = response.output
    assert call.type == "function_call"
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id
    assert response.status == "completed"
    assert "/tools:required/" in raw.headers["x-specgw-class"]  # classified as a tool call
    check_report(
        response.model_extra,
        int(raw.headers["x-specgw-k"]),
        raw.headers["x-specgw-class"],
    )
    # The call's result goes back as input items; the answer is text again.
    follow_up = await gateway.client().responses.create(
        model=MODEL,
        input=[
            *ask,
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": '{"temp_c": 21}'},
        ],
        tools=[WEATHER],
        max_output_tokens=4,
    )
    assert follow_up.output_text


async def test_a_streamed_function_call(gateway: InProcessGateway) -> None:
    stream = await gateway.client().responses.create(
        model=MODEL,
        input="Weather in Rome?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        stream=True,
    )
    events = [event async for event in stream]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1
    assert json.loads(done[0].arguments) == {"city": "Paris"}
    final = events[-1]
    assert final.type == "response.completed"
    assert [item.type for item in final.response.output] == ["function_call"]
    assert final.response.model_extra is not None
    assert "speculation" in final.response.model_extra


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id", "keeps no responses"),
        ({"background": True}, "background", "keeps no responses"),
        ({"conversation": "conv_123"}, "conversation", "keeps no responses"),
        ({"reasoning": {"effort": "high"}}, "reasoning", "reasoning parser"),
        ({"tools": [{"type": "web_search_preview"}]}, "tools[0]", "only `function` tools"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input", "item_reference"),
        ({"input": []}, "input", "must not be empty"),
        ({"vllm_xargs": {"specgw_k": 0}}, "vllm_xargs", "reserved"),
    ],
)
async def test_what_is_not_served_is_an_openai_400(
    gateway: InProcessGateway, extra: dict[str, Any], param: str, says: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await gateway.client().responses.create(model=MODEL, input=QUESTION, extra_body=extra)
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert says in error["message"]


async def test_store_true_is_answered_and_nothing_is_stored(gateway: InProcessGateway) -> None:
    response = await gateway.client().responses.create(
        model=MODEL, input=QUESTION, store=True, max_output_tokens=2
    )
    assert response.output_text
    missing = await gateway.http.get(f"/v1/responses/{response.id}", headers=gateway.auth(USER_KEY))
    assert missing.status_code == 404


async def test_an_unknown_model_is_a_404(gateway: InProcessGateway) -> None:
    with pytest.raises(openai.NotFoundError):
        await gateway.client().responses.create(model="no-such-model", input=QUESTION)


def _ends_in_one_error(text: str) -> dict[str, Any]:
    events = [e for e in text.split("\n\n") if e]
    assert not any(e.startswith("event: response.completed") for e in events)
    assert sum(e.startswith("event: error\n") for e in events) == 1
    assert events[-1].startswith("event: error\n")
    error: dict[str, Any] = json.loads(events[-1].split("data: ", 1)[1])
    assert error["type"] == "error"
    assert error["sequence_number"] == len(events) - 1
    return error


async def test_an_engine_death_mid_stream_ends_in_one_error_event() -> None:
    steps = CountedSteps()
    async with serve_in_process(engine=steps.engine()) as gw:

        async def kill() -> None:
            gw.engine.kill()

        killer = asyncio.create_task(when_streaming(steps, kill))
        body = {"model": MODEL, "input": QUESTION, "max_output_tokens": 1500, "stream": True}
        response = await gw.http.post("/v1/responses", json=body, headers=gw.auth(USER_KEY))
        await killer
        assert response.status_code == 200
        error = _ends_in_one_error(response.text)
        assert error["code"] == "engine_error"
        assert "response.output_text.delta" in response.text  # tokens came before the error
        assert gw.runtime.admission.running == 0


async def test_the_drain_deadline_abort_is_an_error_not_a_completed_response() -> None:
    """vLLM ends an aborted Responses stream with `response.completed`; the gateway reads
    the request's outcome and ends it with an error instead."""
    steps = CountedSteps()
    settings = gateway_settings(drain_timeout_s=0.05)
    async with serve_in_process(settings, engine=steps.engine()) as gw:

        async def drain() -> None:
            gw.runtime.begin_drain()

        drainer = asyncio.create_task(when_streaming(steps, drain))
        body = {"model": MODEL, "input": QUESTION, "max_output_tokens": 1500, "stream": True}
        response = await gw.http.post("/v1/responses", json=body, headers=gw.auth(USER_KEY))
        await drainer
        error = _ends_in_one_error(response.text)
        assert error["code"] == "engine_error"
        assert "aborted" in error["message"]
