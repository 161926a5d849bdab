"""Each input limit (gateway/limits.py, the body size, context length) answers 400/413.

Every case is a body that is valid OpenAI but too costly or unsafe; the answer
must be a 400 (413 for the body size) naming the parameter with a message that
says what the limit is, and it must come back at once (no engine step: the
engine is idle and the answer takes well under a second).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from gateway.settings import GatewaySettings
from tests.gateway.conftest import USER_KEY, GatewayProcess

pytestmark = pytest.mark.engine

DEFAULTS = GatewaySettings()
CHAT = {"model": "specgw-default", "messages": [{"role": "user", "content": "hi"}]}


def _tool(name: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    schema = params or {"type": "object", "properties": {"x": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "parameters": schema}}


def _nested(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "object", "properties": {"a": node}}
    return node


CASES: dict[str, tuple[str, dict[str, Any], str | None, str]] = {
    # name: (path, body, param, words the message must contain)
    "empty_messages": ("/v1/chat/completions", {**CHAT, "messages": []}, "messages", "empty"),
    "too_many_messages": (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": "a"}] * (DEFAULTS.max_messages + 1)},
        "messages",
        f"at most {DEFAULTS.max_messages}",
    ),
    "too_many_tools": (
        "/v1/chat/completions",
        {**CHAT, "tools": [_tool(f"t{i}") for i in range(DEFAULTS.max_tools + 1)]},
        "tools",
        f"at most {DEFAULTS.max_tools}",
    ),
    "tool_schema_too_big": (
        "/v1/chat/completions",
        {
            **CHAT,
            "tools": [
                _tool(
                    "big", {"type": "object", "description": "d" * DEFAULTS.max_tool_schema_bytes}
                )
            ],
        },
        "tools",
        f"at most {DEFAULTS.max_tool_schema_bytes}",
    ),
    "tool_schema_too_deep": (
        "/v1/chat/completions",
        {**CHAT, "tools": [_tool("deep", _nested(DEFAULTS.max_schema_depth))]},
        "tools",
        f"deeper than {DEFAULTS.max_schema_depth}",
    ),
    "response_format_too_deep": (
        "/v1/chat/completions",
        {
            **CHAT,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": _nested(DEFAULTS.max_schema_depth)},
            },
        },
        "response_format",
        f"deeper than {DEFAULTS.max_schema_depth}",
    ),
    "too_many_stops": (
        "/v1/chat/completions",
        {**CHAT, "stop": [f"s{i}" for i in range(DEFAULTS.max_stop_sequences + 1)]},
        "stop",
        "stop",  # vLLM's list length check answers first, with a vaguer message
    ),
    "stop_too_long": (
        "/v1/completions",
        {"model": "specgw-default", "prompt": "hi", "stop": "s" * (DEFAULTS.max_stop_length + 1)},
        "stop",
        f"1..{DEFAULTS.max_stop_length}",
    ),
    "empty_stop": ("/v1/chat/completions", {**CHAT, "stop": [""]}, "stop", "characters"),
    "nul_in_content": (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": "a\x00b"}]},
        "messages[0].content",
        "U+0000",
    ),
    "escape_in_prompt": (
        "/v1/completions",
        {"model": "specgw-default", "prompt": "a\x1b[2Jb"},
        "prompt",
        "U+001B",
    ),
    "surrogate_in_content_part": (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud83d"}]}]},
        "messages[0].content[0].text",
        "U+D83D",
    ),
    # vLLM's request model parses it (OpenAI-harmony `Message`) for any model; it was a 500.
    "harmony_message_to_a_chat_format_model": (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"author": {"role": "user"}, "content": [{"text": "hi"}]}]},
        "messages",
        "harmony",
    ),
    "chat_n_above_1": ("/v1/chat/completions", {**CHAT, "n": 2}, "n", "n must be 1"),
    "completion_n_above_1": (
        "/v1/completions",
        {"model": "specgw-default", "prompt": "hi", "n": 3},
        "n",
        "n must be 1",
    ),
    # vLLM's beam search divided by zero on an extreme length_penalty (a 500): refused.
    "chat_beam_search": (
        "/v1/chat/completions",
        {**CHAT, "use_beam_search": True, "length_penalty": -3.3e16},
        "use_beam_search",
        "not supported",
    ),
    "completion_beam_search": (
        "/v1/completions",
        {"model": "specgw-default", "prompt": "hi", "use_beam_search": True},
        "use_beam_search",
        "not supported",
    ),
    "batched_prompts": (
        "/v1/completions",
        {"model": "specgw-default", "prompt": ["a", "b"]},
        "prompt",
        "one prompt per request",
    ),
    "reserved_xargs": (
        "/v1/chat/completions",
        {**CHAT, "vllm_xargs": {"specgw_k": 0}},
        "vllm_xargs",
        "reserved",
    ),
    "reserved_cap_xargs": (  # a client may not lower every request in the engine
        "/v1/completions",
        {"model": "specgw-default", "prompt": "hello", "vllm_xargs": {"specgw_cap": 0}},
        "vllm_xargs",
        "reserved",
    ),
    "chat_prompt_longer_than_context": (
        "/v1/chat/completions",
        {**CHAT, "messages": [{"role": "user", "content": "hello " * 5000}], "max_tokens": 4},
        None,
        "context",
    ),
    "prompt_longer_than_context": (
        "/v1/completions",
        {"model": "specgw-default", "prompt": "hello " * 5000, "max_tokens": 4},
        None,
        "context",
    ),
    "max_tokens_beyond_context": (
        "/v1/chat/completions",
        {**CHAT, "max_tokens": 1_000_000},
        None,
        "max_tokens",
    ),
}


#: Cases pinned on a known gateway bug (strict xfail, so a fix flips them); none open now.
KNOWN_BROKEN: dict[str, str] = {}


def _cases() -> list[object]:
    return [
        pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_BROKEN[name]))
        if name in KNOWN_BROKEN
        else name
        for name in sorted(CASES)
    ]


@pytest.mark.parametrize("name", _cases())
def test_limit_is_400_with_a_clear_message(shared_gateway: GatewayProcess, name: str) -> None:
    path, body, param, words = CASES[name]
    headers = {"authorization": f"Bearer {USER_KEY}", "content-type": "application/json"}
    # ensure_ascii: lone surrogates travel as JSON escapes, as a client library would send them.
    content = json.dumps(body, ensure_ascii=True).encode()
    started = time.monotonic()
    response = httpx.post(
        shared_gateway.base_url + path, content=content, headers=headers, timeout=60
    )
    took = time.monotonic() - started
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert words.lower() in error["message"].lower(), error
    if param is not None:  # vLLM's own type checks name the branch: "stop.str"
        assert error["param"] == param or error["param"].startswith(f"{param}."), error
    assert response.headers.get("x-request-id")
    assert took < 1.0, f"{name}: {took:.3f} s"
    with shared_gateway.http() as http:
        detail = http.get("/ready").json()["detail"]
    assert detail["engine_running"] == 0
    assert detail["engine_waiting"] == 0


def test_body_over_the_size_limit_is_413(shared_gateway: GatewayProcess) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "x" * DEFAULTS.max_body_bytes}]}
    headers = {"authorization": f"Bearer {USER_KEY}"}
    started = time.monotonic()
    response = httpx.post(
        shared_gateway.base_url + "/v1/chat/completions", json=body, headers=headers, timeout=60
    )
    took = time.monotonic() - started
    assert response.status_code == 413, response.text[:300]
    error = response.json()["error"]
    assert str(DEFAULTS.max_body_bytes) in error["message"]
    assert error["code"] == "payload_too_large"
    assert took < 2.0
