"""`/v1/responses` on the real engine, through vLLM's own Responses serving layer, driven
with the official `openai` client's `responses.create`: plain, streamed and with a
function tool, each with `x-specgw-k` and the speculation report."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.gateway.conftest import GatewayProcess
from tests.models import trained_model
from tests.spec_report import check_report

pytestmark = pytest.mark.engine

MODEL = "specgw-default"
INSTRUCTIONS = "You are a helpful Python assistant."
QUESTION = "What does the json module do?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    # An enum keeps the forced JSON short whatever the model is (structured output).
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
        "required": ["city"],
    },
    "strict": True,
}


def check_speculation(extra: dict[str, Any] | None, headers: Any) -> None:
    """The report (vLLM's block, which vLLM's Responses serving does not write, from the
    engine's counts; the gateway's decision beside it) agrees with the headers."""
    check_report(extra, int(headers["x-specgw-k"]), headers["x-specgw-class"])


def test_a_plain_response(gateway: GatewayProcess) -> None:
    raw = gateway.client().responses.with_raw_response.create(
        model=MODEL, instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=24, temperature=0
    )
    response = raw.parse()
    assert raw.headers["x-request-id"]
    assert raw.headers["x-specgw-class"].startswith("chat/")
    assert response.id.startswith("resp_")
    assert response.status in {"completed", "incomplete"}
    assert response.output_text
    assert response.usage is not None
    assert 0 < response.usage.output_tokens <= 24
    check_speculation(response.model_extra, raw.headers)


def test_messages_input_is_classified_as_the_same_chat(gateway: GatewayProcess) -> None:
    messages = [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": QUESTION},
    ]
    client = gateway.client()
    chat = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=messages,  # type: ignore[arg-type]
        max_tokens=8,
        temperature=0,
    )
    response = client.responses.with_raw_response.create(
        model=MODEL,
        input=messages,  # type: ignore[arg-type]
        max_output_tokens=8,
        temperature=0,
        store=False,
    )
    assert response.headers["x-specgw-class"] == chat.headers["x-specgw-class"]
    # Greedy, same prompt through vLLM's chat and Responses renderers: the same words.
    assert response.parse().output_text == chat.parse().choices[0].message.content


def test_a_streamed_response_ends_with_completed(gateway: GatewayProcess) -> None:
    client = gateway.client()
    plain = client.responses.create(
        model=MODEL, instructions=INSTRUCTIONS, input=QUESTION, max_output_tokens=16, temperature=0
    )
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        instructions=INSTRUCTIONS,
        input=QUESTION,
        max_output_tokens=16,
        temperature=0,
        stream=True,
    )
    events = list(raw.parse())
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert deltas == final.output_text == plain.output_text
    check_speculation(final.model_extra, raw.headers)


@pytest.mark.skipif(
    not trained_model(),
    reason="a random-weight model pads forced JSON with whitespace until max_output_tokens",
)
def test_a_function_tool_is_called(gateway: GatewayProcess) -> None:
    client = gateway.client()
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    raw = client.responses.with_raw_response.create(
        model=MODEL,
        input=ask,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=48,
        temperature=0,
    )
    response = raw.parse()
    calls = [item for item in response.output if item.type == "function_call"]
    assert calls, response.output
    assert calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"] in {"Paris", "Rome"}
    assert "/tools:required/" in raw.headers["x-specgw-class"]
    check_speculation(response.model_extra, raw.headers)
    stream = client.responses.create(
        model=MODEL,
        input=ask,  # type: ignore[arg-type]
        tools=[WEATHER],  # type: ignore[list-item]
        tool_choice="required",
        max_output_tokens=48,
        temperature=0,
        stream=True,
    )
    events = list(stream)
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1
    assert json.loads(done[0].arguments) == json.loads(calls[0].arguments)
    assert events[-1].type == "response.completed"
    assert events[-1].response.model_extra is not None
    assert "speculation" in events[-1].response.model_extra


def test_state_bound_features_are_an_openai_400(gateway: GatewayProcess) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        gateway.client().responses.create(
            model=MODEL, input=QUESTION, previous_response_id="resp_unknown"
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "previous_response_id"
    assert "keeps no responses" in error["message"]
