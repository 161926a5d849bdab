"""What the fake backend says on the wire, in vLLM's own models and SSE framing.

The shapes follow vLLM's OpenAI serving layer (`vllm/entrypoints/openai/
chat_completion/serving.py`, `completion/serving.py`): a stream is
`data: <chunk>\\n\\n` lines dumped with `exclude_unset` (so only the finishing
chunk has a string `finish_reason`), an optional usage chunk with `choices: []`,
then `data: [DONE]\\n\\n`; a failure is raised (`engine.port`), never written
on the wire. Tool calls are forced the way a model under `tool_choice` "required" or a
named function is (structured output): the function's required arguments, each
a placeholder its JSON schema allows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engine.interface import EngineError, ErrorClass
from engine.protocol import (
    ChatCompletionNamedToolChoiceParam,
    ChatCompletionRequest,
    FunctionCall,
    PromptTokenUsageInfo,
    ToolCall,
    UsageInfo,
)

DONE = "data: [DONE]\n\n"

#: A placeholder per JSON-schema type, for a required argument with no enum or default.
_PLACEHOLDERS: dict[str, Any] = {
    "string": "",
    "integer": 0,
    "number": 0,
    "boolean": False,
    "array": [],
    "null": None,
}


def sse(payload: str) -> str:
    """One SSE event as vLLM frames it."""
    return f"data: {payload}\n\n"


def not_found(model: str | None, served: str) -> EngineError:
    """vLLM's refusal of a request naming a model it does not serve (`_check_model`)."""
    message = f"The model `{model}` does not exist. Valid aliases: {served}."
    return EngineError(message, kind=ErrorClass.NOT_FOUND, param="model")


def usage(prompt_tokens: int, completion_tokens: int) -> UsageInfo:
    """Usage with the prompt's cached tokens, as `--enable-prompt-tokens-details` reports
    them (the fake keeps no prefix cache: none)."""
    return UsageInfo(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=0),
    )


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a content list."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        return " ".join(str(p) for p in parts)
    return ""


def chat_prompt(request: ChatCompletionRequest) -> str:
    """The fake's chat template: one `role: text` line per message, the offered tools'
    names, and the assistant's turn. Deterministic, so the fake's tokens (a function of
    the prompt) are too."""
    lines = []
    for message in request.messages:
        plain = message if isinstance(message, dict) else message.model_dump(exclude_none=True)
        lines.append(f"{plain.get('role', 'user')}: {_text(plain.get('content'))}")
    if request.tools:
        lines.append("tools: " + " ".join(t.function.name for t in request.tools))
    lines.append("assistant:")
    return "\n".join(lines)


def placeholder(schema: Any) -> Any:
    """A value `schema` allows: its default, else its first enum value, else one per type
    (an object: its required keys, each filled the same way)."""
    if not isinstance(schema, dict):
        return None
    if "default" in schema:
        return schema["default"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        properties = schema.get("properties") or {}
        return {key: placeholder(properties.get(key, {})) for key in schema.get("required", [])}
    return _PLACEHOLDERS.get(str(kind))


def forced_tool_call(request: ChatCompletionRequest, gateway_id: str) -> ToolCall | None:
    """The call a request forces (`tool_choice` "required": the first tool; a named
    function: that one), or None where the model may answer in text."""
    choice = request.tool_choice
    if not request.tools or choice is None or choice in ("none", "auto"):
        return None
    tools = request.tools
    if isinstance(choice, ChatCompletionNamedToolChoiceParam):
        tools = [t for t in tools if t.function.name == choice.function.name] or tools
    function = tools[0].function
    arguments = placeholder(function.parameters or {"type": "object"})
    return ToolCall(
        id=f"chatcmpl-tool-{gateway_id}",
        function=FunctionCall(name=function.name, arguments=json.dumps(arguments)),
    )


def named_choice(request: ChatCompletionRequest) -> bool:
    """Whether the request names its function: vLLM then ends with `stop`, as OpenAI
    does, and with `tool_calls` for "required"."""
    return isinstance(request.tool_choice, ChatCompletionNamedToolChoiceParam)
