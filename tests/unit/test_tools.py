"""Tool calls through the official client: forced calls, their JSON arguments, streaming."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.unit.conftest import MODEL, InProcessGateway

pytestmark = pytest.mark.asyncio(loop_scope="session")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "enum": ["Paris", "Rome"]},
                "unit": {"type": "string", "default": "celsius"},
                "days": {"type": "integer"},
                "hourly": {"type": "boolean"},
            },
            "required": ["city", "unit", "days"],
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}},
}
ASK = [{"role": "user", "content": "Weather in Paris for two days?"}]


async def _chat(gw: InProcessGateway, **body: Any) -> Any:
    return await gw.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=8, temperature=0, **body
    )


async def test_required_calls_the_first_tool_with_its_required_arguments(
    gateway: InProcessGateway,
) -> None:
    completion = await _chat(gateway, tools=[WEATHER, CLOCK], tool_choice="required")
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls
    assert call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "celsius", "days": 0}
    assert completion.model_extra["speculation"]["k"] >= 0


async def test_a_named_function_is_called_and_ends_with_stop(gateway: InProcessGateway) -> None:
    """As vLLM and OpenAI answer a named `tool_choice`: the call, `finish_reason` stop."""
    named = {"type": "function", "function": {"name": "get_time"}}
    completion = await _chat(gateway, tools=[WEATHER, CLOCK], tool_choice=named)
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments) == {}


@pytest.mark.parametrize("choice", ["auto", "none"])
async def test_auto_and_none_answer_in_text(gateway: InProcessGateway, choice: str) -> None:
    completion = await _chat(gateway, tools=[WEATHER], tool_choice=choice)
    message = completion.choices[0].message
    assert not message.tool_calls
    assert message.content
    assert completion.choices[0].finish_reason == "length"


async def test_tool_requests_are_their_own_class(gateway: InProcessGateway) -> None:
    client = gateway.client()
    plain = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=4, temperature=0
    )
    tools = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=ASK, max_tokens=4, temperature=0, tools=[WEATHER],
        tool_choice="required",
    )  # fmt: skip
    assert "tools" in tools.headers["x-specgw-class"]
    assert plain.headers["x-specgw-class"] != tools.headers["x-specgw-class"]


async def test_a_streamed_call_joins_into_the_same_call(gateway: InProcessGateway) -> None:
    full = await _chat(gateway, tools=[WEATHER], tool_choice="required")
    stream = await gateway.client().chat.completions.create(
        model=MODEL, messages=ASK, max_tokens=8, temperature=0, tools=[WEATHER],
        tool_choice="required", stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert [c.function.name for c in calls if c.function and c.function.name] == ["get_weather"]
    arguments = "".join(c.function.arguments or "" for c in calls if c.function)
    assert json.loads(arguments) == json.loads(
        full.choices[0].message.tool_calls[0].function.arguments
    )
    assert not "".join(d.content or "" for d in deltas)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].model_extra["speculation"]["k"] >= 0


async def test_a_tool_result_round_trip(gateway: InProcessGateway) -> None:
    first = await _chat(gateway, tools=[WEATHER], tool_choice="required")
    call = first.choices[0].message.tool_calls[0]
    second = await gateway.client().chat.completions.create(
        model=MODEL,
        messages=[
            *ASK,
            {"role": "assistant", "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'},
        ],
        tools=[WEATHER],
        max_tokens=6,
        temperature=0,
    )
    assert second.choices[0].finish_reason == "length"
    assert second.choices[0].message.content


async def test_a_named_function_that_is_not_offered_is_refused(gateway: InProcessGateway) -> None:
    named = {"type": "function", "function": {"name": "launch_rocket"}}
    with pytest.raises(openai.BadRequestError) as caught:
        await _chat(gateway, tools=[WEATHER], tool_choice=named)
    assert caught.value.status_code == 400


async def test_tool_definitions_count_in_the_prompt_length_class(
    gateway: InProcessGateway,
) -> None:
    """The template renders the schemas into the prompt, so a short question with many
    tools is a long prompt: its class's length bucket counts them."""
    many = [
        {
            "type": "function",
            "function": {**WEATHER["function"], "name": f"get_weather_{i}"},
        }
        for i in range(8)
    ]
    await _chat(gateway, tools=many, tool_choice="auto")
    await _chat(gateway)
    labels = {row["label"] for row in gateway.runtime.class_report()}
    lengths = {
        int(part.removeprefix("len:"))
        for label in labels
        for part in label.split("/")
        if part.startswith("len:")
    }
    assert any("tools" in label and "len:64" not in label for label in labels), labels
    assert 64 in lengths, labels  # the same question without tools stays short
