"""A request body that the gateway's classifier puts in the class a label names.

`GET /admin/classes` and the benchmark's records name a class by its label
(`gateway.control.classify.label_of`, e.g. `chat/sys:ab12/tools/toolmsg/len:512/t1`), never by
the request text, which the gateway does not keep. `synthetic_class` builds a body with every
feature the label shows (template, user turns, tools and tool choice, tool results, response
format, sampling bucket) and the length bucket to draw prompt lengths in. The system prompt is
known only by its hash, so a stand-in text takes its place: the class keeps its own identity,
distinct from every other label's, but not the gateway's id.
"""

from __future__ import annotations

import json
from typing import Any

_SAMPLED_TEMPERATURE = {"t0.5": 0.5, "t1": 0.7, "t2": 1.5}
#: Raw-prompt templates (head with the system prompt, one user turn), as `raw_template` and
#: `_raw_system_prompt` in `gateway.control.features` read them.
_RAW_TEMPLATES = {
    "chatml": ("<|im_start|>system\n{system}<|im_end|>\n", "<|im_start|>user\nHelp.<|im_end|>\n"),
    "llama3": (
        "<|start_header_id|>system<|end_header_id|>{system}<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>Help.<|eot_id|>",
    ),
    "llama2": ("<<SYS>>{system}<</SYS>>\n\n", "[INST] Help. [/INST]\n"),
    "alpaca": ("{system}\n\n", "### Instruction:\nHelp.\n\n"),
}
_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a record up by its key.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
    },
}


def _stand_in_system(system_id: str) -> str:
    """A system prompt standing in for one known only by its hash: the hash spelt in letters
    (digits would be masked by the classifier's normalisation and merge two classes)."""
    letters = "".join(
        chr(ord("a") + int(c, 16)) if c in "0123456789abcdef" else c for c in system_id
    )
    return f"Stand-in system prompt for class system {letters}."


def _chat_messages(system: str | None, turns: int, tool_messages: bool) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for i in range(turns):
        if i:
            messages.append({"role": "assistant", "content": "Understood."})
        messages.append({"role": "user", "content": "Please help with this request."})
    if tool_messages:
        call = {"name": "lookup", "arguments": json.dumps({"key": "a"})}
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "call_0", "type": "function", "function": call}],
            }
        )
        messages.append({"role": "tool", "tool_call_id": "call_0", "content": '{"value": 1}'})
    return messages


def synthetic_class(label: str) -> dict[str, Any]:
    """`endpoint`, `request`, `temperature` and the length bucket for a gateway class label
    (`gateway.control.classify.label_of`), e.g. `chat/sys:ab12/tools/toolmsg/len:512/t1`."""
    template, *parts = label.split("/")
    fields = {key: value for key, _, value in (p.partition(":") for p in parts)}
    system = _stand_in_system(fields["sys"]) if "sys" in fields else None
    turns = int(fields.get("turns", 1))
    temperature = _SAMPLED_TEMPERATURE.get(
        next((p for p in parts if p in _SAMPLED_TEMPERATURE), ""), 0.0
    )
    bucket = int(fields.get("len", 64))
    if template != "chat":
        if template in _RAW_TEMPLATES:
            head, turn = _RAW_TEMPLATES[template]
            prompt = head.format(system=system or "") + turn * turns
            if template == "chatml" and "toolmsg" in fields:
                prompt += '<|im_start|>tool\n{"value": 1}<|im_end|>\n'
        else:
            prompt = "def stand_in():\n" if template == "code" else "A stand-in prompt."
        request: dict[str, Any] = {"prompt": prompt}
        return {
            "endpoint": "completions",
            "request": request,
            "temperature": temperature,
            "bucket": bucket,
        }
    request = {"messages": _chat_messages(system, turns, "toolmsg" in fields)}
    if "tools" in fields:
        request["tools"] = [_TOOL]
        choice = fields["tools"]
        if choice == "named":
            request["tool_choice"] = {"type": "function", "function": {"name": "lookup"}}
        elif choice:
            request["tool_choice"] = choice
    for kind in ("json_object", "json_schema", "structural_tag", "other"):
        if kind in fields:
            request["response_format"] = {"type": kind}
    return {"endpoint": "chat", "request": request, "temperature": temperature, "bucket": bucket}
