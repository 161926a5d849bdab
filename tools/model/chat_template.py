"""The main chat template: ChatML with Hermes-style tool calls (Qwen2.5 layout).

vLLM's `hermes` tool parser finds `<tool_call>` / `</tool_call>` in the output
text and parses the JSON between them, so assistant tool calls are rendered as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` and tools are
listed as JSON inside `<tools></tools>` in the system turn. Tool results come
back as role `tool` and are rendered inside a user turn, as Qwen2.5 does.

The same Jinja string is saved in `tokenizer_config.json` (so vLLM's
`/v1/chat/completions` renders prompts exactly as the model was trained) and
rendered here, with the same `tojson` as transformers, to make training text.
"""

from __future__ import annotations

import json
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS: tuple[str, ...] = (ENDOFTEXT, IM_START, IM_END)
#: Added as ordinary (non-special) tokens: they must survive detokenisation.
TOOL_TOKENS: tuple[str, ...] = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)

CHAT_TEMPLATE = (
    "{% if tools %}"
    "<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "\nYou may call functions. Available tools:\n<tools>\n"
    "{% for tool in tools %}"
    "{% if tool['function'] is defined %}{% set tool = tool['function'] %}{% endif %}"
    "{{ tool | tojson }}\n"
    "{% endfor %}"
    "</tools>\nTo call a function, reply with <tool_call></tool_call> around a JSON object "
    "with its name and arguments.<|im_end|>\n"
    "{% elif messages[0]['role'] == 'system' %}"
    "<|im_start|>system\n{{ messages[0]['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message['content'] }}\n</tool_response><|im_end|>\n"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "<|im_start|>assistant\n"
    "{% if message['content'] %}{{ message['content'] }}\n{% endif %}"
    "{% for tc in message['tool_calls'] %}"
    "{% if tc['function'] is defined %}{% set tc = tc['function'] %}{% endif %}"
    '<tool_call>\n{"name": "{{ tc["name"] }}", "arguments": '
    "{% if tc['arguments'] is string %}{{ tc['arguments'] }}"
    "{% else %}{{ tc['arguments'] | tojson }}{% endif %}"
    "}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% else %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: int | None = None, sort_keys: bool = False
) -> str:
    """transformers' `tojson` (no HTML escaping), so training text matches serving text."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, sort_keys=sort_keys)


def render_chat(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = False,
) -> str:
    """Render a conversation with the main template, as vLLM will."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    template = env.from_string(CHAT_TEMPLATE)
    msgs = [{"tool_calls": None, **m} for m in messages]
    return template.render(messages=msgs, tools=tools, add_generation_prompt=add_generation_prompt)


def tool_call_text(name: str, arguments: dict[str, Any]) -> str:
    """The assistant text of one Hermes tool call, exactly as the template renders it."""
    return f'<tool_call>\n{{"name": "{name}", "arguments": {_tojson(arguments)}}}\n</tool_call>'
