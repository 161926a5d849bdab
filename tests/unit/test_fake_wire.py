"""The fake backend's wire helpers: forced tool-call arguments, prompts, SSE error events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from engine.fake_wire import chat_prompt, forced_tool_call, not_found, placeholder
from engine.interface import ErrorClass
from engine.protocol import ChatCompletionRequest


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "string"}, ""),
        ({"type": "integer"}, 0),
        ({"type": "number"}, 0),
        ({"type": "boolean"}, False),
        ({"type": "array", "items": {"type": "string"}}, []),
        ({"type": "null"}, None),
        ({"type": ["null", "integer"]}, 0),
        ({"type": "string", "enum": ["b", "a"]}, "b"),
        ({"type": "integer", "default": 7}, 7),
        ({"type": "object", "properties": {"a": {"type": "string"}}}, {}),
        (
            {
                "type": "object",
                "properties": {
                    "a": {"type": "string"},
                    "b": {
                        "type": "object",
                        "properties": {"c": {"type": "integer"}},
                        "required": ["c"],
                    },
                    "d": {"type": "boolean"},
                },
                "required": ["a", "b"],
            },
            {"a": "", "b": {"c": 0}},
        ),
        ({"properties": {"x": {}}, "required": ["x"]}, {"x": {}}),
        ("not a schema", None),
    ],
)
def test_placeholder_fills_what_the_schema_requires(schema: Any, value: Any) -> None:
    assert placeholder(schema) == value


def _request(**body: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi there"}], **body}
    )


TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("choice", "called"),
    [
        (None, None),
        ("none", None),
        ("auto", None),
        ("required", "f"),
        ({"type": "function", "function": {"name": "g"}}, "g"),
    ],
)
def test_which_requests_force_a_call(choice: Any, called: str | None) -> None:
    other = {"type": "function", "function": {"name": "g"}}
    body: dict[str, Any] = {"tools": [TOOL, other]}
    if choice is not None:
        body["tool_choice"] = choice
    call = forced_tool_call(_request(**body), "gid")
    assert (call.function.name if call else None) == called
    if call is not None:
        assert json.loads(call.function.arguments) == {}
        assert call.id == "chatcmpl-tool-gid"


def test_the_chat_prompt_is_deterministic_and_names_the_tools() -> None:
    request = _request(tools=[TOOL])
    assert chat_prompt(request) == "user: hi there\ntools: f\nassistant:"
    assert chat_prompt(request) == chat_prompt(_request(tools=[TOOL]))


def test_not_found_is_a_not_found_engine_error() -> None:
    missing = not_found("x", "specgw-default")
    assert (missing.kind, missing.param) == (ErrorClass.NOT_FOUND, "model")
    assert "`x` does not exist" in str(missing)
