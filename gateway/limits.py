"""Input limits checked before any engine work, so a hostile request costs no engine time.

vLLM's protocol models validate types; these checks bound what a valid-typed
request may cost (message count, tool schema size and depth, stop strings) and
reject text that no tokenizer should see (NUL and other C0 control characters
except tab/newline/carriage return, lone surrogates). Each failure is a 400
naming the offending parameter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from gateway.errors import invalid
from gateway.settings import GatewaySettings

_BAD_CHARS = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff]")


def _depth(value: Any, limit: int) -> int:
    """Nesting depth of a JSON value, stopping early past `limit`."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    deepest = 0
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        if isinstance(node, dict):
            stack.extend((v, depth + 1) for v in node.values())
        elif isinstance(node, list):
            stack.extend((v, depth + 1) for v in node)
    return deepest


def check_text(text: str, param: str) -> None:
    match = _BAD_CHARS.search(text)
    if match is not None:
        raise invalid(
            f"{param} contains a control or invalid unicode character "
            f"(U+{ord(match.group()):04X} at offset {match.start()})",
            param=param,
        )


def _message_texts(messages: Iterable[Any]) -> Iterable[tuple[str, str]]:
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            yield f"messages[{i}].content", content
        elif isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield f"messages[{i}].content[{j}].text", part["text"]


def check_stop(stop: str | list[str] | None, settings: GatewaySettings) -> None:
    stops = [stop] if isinstance(stop, str) else list(stop or [])
    if len(stops) > settings.max_stop_sequences:
        raise invalid(f"at most {settings.max_stop_sequences} stop sequences", param="stop")
    for s in stops:
        if not s or len(s) > settings.max_stop_length:
            raise invalid(
                f"stop sequences must be 1..{settings.max_stop_length} characters", param="stop"
            )
        check_text(s, "stop")


def check_schema(schema: Any, param: str, settings: GatewaySettings) -> None:
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > settings.max_tool_schema_bytes:
        raise invalid(f"{param} is {size} bytes; at most {settings.max_tool_schema_bytes}", param)
    if _depth(schema, settings.max_schema_depth) > settings.max_schema_depth:
        raise invalid(f"{param} nests deeper than {settings.max_schema_depth} levels", param)


def check_single(body: dict[str, Any]) -> None:
    """One choice per request: speculation is measured, decided and reported per request,
    and vLLM's fan-out into n child requests would leave the choices unmeasured."""
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n != 1:
        raise invalid(
            "n must be 1: spec-gateway measures and reports speculation per request; "
            "send n requests instead",
            param="n",
        )
    if body.get("use_beam_search") is True:
        raise invalid(
            "use_beam_search is not supported: beam search runs several sequences per "
            "request outside speculative decoding, which spec-gateway measures and "
            "steers per request",
            param="use_beam_search",
        )


def check_chat(body: dict[str, Any], settings: GatewaySettings) -> None:
    """Checks on the raw JSON body of a chat request (before vLLM parses it)."""
    check_single(body)
    messages = body.get("messages")
    if isinstance(messages, list):
        if not messages:
            raise invalid("messages must not be empty", param="messages")
        if len(messages) > settings.max_messages:
            raise invalid(f"at most {settings.max_messages} messages", param="messages")
        for param, text in _message_texts(messages):
            check_text(text, param)
    tools = body.get("tools")
    if isinstance(tools, list):
        if len(tools) > settings.max_tools:
            raise invalid(f"at most {settings.max_tools} tools", param="tools")
        check_schema(tools, "tools", settings)
    response_format = body.get("response_format")
    if isinstance(response_format, dict):
        check_schema(response_format, "response_format", settings)
    stop = body.get("stop")
    if isinstance(stop, str | list):
        check_stop(stop, settings)


def reject_reserved_xargs(xargs: dict[str, Any] | None, reserved: Iterable[str]) -> None:
    """Clients cannot steer speculation: the controller and ops flags own k."""
    if not xargs:
        return
    taken = sorted(set(xargs) & set(reserved))
    if taken:
        raise invalid(
            f"vllm_xargs keys {taken} are reserved: the gateway sets the speculation depth",
            param="vllm_xargs",
        )
