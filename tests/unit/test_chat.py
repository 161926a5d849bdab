"""`/v1/chat/completions` through the official client, the whole gateway in process."""

from __future__ import annotations

from typing import Any

import pytest

from engine.fake_wire import chat_prompt
from engine.protocol import ChatCompletionRequest
from tests.spec_report import check_report
from tests.unit.conftest import MESSAGES, MODEL, InProcessGateway

pytestmark = pytest.mark.asyncio(loop_scope="session")


def expected_text(gw: InProcessGateway, messages: list[dict[str, Any]], tokens: int) -> str:
    """What the fake model says: its tokens are a function of the prompt and position."""
    request = ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages})
    prompt = chat_prompt(request)
    return "".join(f" t{gw.engine.token_at(prompt, i)}" for i in range(tokens))


async def test_non_streaming_reply_headers_and_speculation(gateway: InProcessGateway) -> None:
    raw = await gateway.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0
    )
    completion = raw.parse()
    assert raw.status_code == 200
    assert raw.headers["x-request-id"]
    k = int(raw.headers["x-specgw-k"])
    label = raw.headers["x-specgw-class"]
    assert label.startswith("chat/")
    choice = completion.choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.role == "assistant"
    assert choice.message.content == expected_text(gateway, MESSAGES, 24)
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 24
    assert completion.usage.prompt_tokens == len(chat_prompt_words(MESSAGES))
    assert completion.model == MODEL
    assert completion.id.startswith("chatcmpl-")
    check_report(completion.model_extra, k, label)


def chat_prompt_words(messages: list[dict[str, Any]]) -> list[str]:
    request = ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages})
    return chat_prompt(request).split()


async def test_stream_says_what_the_reply_says_and_ends_with_usage(
    gateway: InProcessGateway,
) -> None:
    client = gateway.client()
    full = await client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=20, temperature=0
    )
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    k, label = int(raw.headers["x-specgw-k"]), raw.headers["x-specgw-class"]
    chunks = [chunk async for chunk in raw.parse()]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length"
    assert set(finishes[:-1]) == {None}
    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.completion_tokens == 20
    check_report(last.model_extra, k, label)


async def test_raw_stream_is_sse_ending_with_done(gateway: InProcessGateway) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 6, "stream": True}
    response = await gateway.http.post(
        "/v1/chat/completions", json=body, headers=gateway.auth("sk-unit-user")
    )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-specgw-k"].isdigit()
    events = [line for line in response.text.split("\n\n") if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert not any('"usage"' in e for e in events)  # not asked for: no usage chunk


async def test_max_completion_tokens_and_multi_part_content(gateway: InProcessGateway) -> None:
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Two"}, {"type": "text", "text": "parts"}],
        }
    ]
    completion = await gateway.client().chat.completions.create(
        model=MODEL,
        messages=messages,
        max_completion_tokens=5,
        temperature=0,
    )
    assert completion.usage is not None
    assert completion.usage.completion_tokens == 5
    assert completion.choices[0].message.content == expected_text(gateway, messages, 5)


async def test_a_multi_turn_conversation(gateway: InProcessGateway) -> None:
    messages = [
        *MESSAGES,
        {"role": "assistant", "content": "It encodes and decodes JSON."},
        {"role": "user", "content": "And pickle?"},
    ]
    completion = await gateway.client().chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=8,
        temperature=0,
    )
    assert completion.choices[0].message.content == expected_text(gateway, messages, 8)


async def test_default_max_tokens_and_sampling(gateway: InProcessGateway) -> None:
    """No max_tokens: the fake's default; no temperature: the backend's default (1.0), a
    sampled request, classified apart from greedy ones."""
    client = gateway.client()
    sampled = await client.chat.completions.with_raw_response.create(model=MODEL, messages=MESSAGES)
    greedy = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, temperature=0
    )
    usage = sampled.parse().usage
    assert usage is not None
    assert usage.completion_tokens == 16
    assert sampled.headers["x-specgw-class"] != greedy.headers["x-specgw-class"]


async def test_client_request_id_is_echoed(gateway: InProcessGateway) -> None:
    raw = await gateway.client().chat.completions.with_raw_response.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=2,
        extra_headers={"x-request-id": "trace-abc.1"},
    )
    assert raw.headers["x-request-id"] == "trace-abc.1"


async def test_concurrent_requests_all_complete(gateway: InProcessGateway) -> None:
    import asyncio

    client = gateway.client()
    replies = await asyncio.gather(
        *(
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"question {i}"}],
                max_tokens=12,
                temperature=0,
            )
            for i in range(8)
        )
    )
    assert [r.choices[0].finish_reason for r in replies] == ["length"] * 8
    assert len(gateway.engine.outcomes) == 8
    assert gateway.runtime.admission.running == 0
