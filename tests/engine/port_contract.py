"""The serving-port contract: every `ServingPort` (OpenAIFrontend, FakeFrontend) passes these.

Each check is an async function of a `PortHarness`: the port, and its engine's outcome
tap (`engine.outcomes`), which must hold no entry once a check's requests have ended.
Every answer is `Served(reply, outcome)`: the outcome resolved before a whole reply is
returned and before a stream's last chunk. `tests/engine/test_port_contract.py` runs
them on each backend's port, built by its plugin: the fake in the unit tier, vLLM in the
engine tier. Requests are greedy, so a stream and a reply of the same request say the
same text.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from engine.interface import EngineError, ErrorClass, RequestOutcome
from engine.outcomes import OutcomeTap, Served
from engine.port import ServingPort
from engine.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ResponsesRequest,
    ResponsesResponse,
)
from engine.spec_decode_report import speculative_decoding

MESSAGES = [{"role": "user", "content": "Name three rivers of Europe."}]
PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n    return"


@dataclass
class PortHarness:
    port: ServingPort
    max_depth: int
    #: Longest prompt + completion the backend serves (tokens).
    max_model_len: int
    #: The engine's outcome tap, where the port's outcomes are pending.
    tap: OutcomeTap = field(default_factory=OutcomeTap)


def _resolved(served: Served[Any]) -> RequestOutcome:
    """The outcome of an answer, which must be there already, and not None."""
    assert served.outcome.done(), "the outcome must resolve before the reply is returned"
    outcome = served.outcome.result()
    assert outcome is not None
    return outcome


def _gid() -> str:
    return uuid.uuid4().hex


def _chat(port: ServingPort, **body: Any) -> ChatCompletionRequest:
    fields = {"model": port.served_model_name, "messages": MESSAGES, "temperature": 0, **body}
    return ChatCompletionRequest.model_validate(fields)


def _completion(port: ServingPort, **body: Any) -> CompletionRequest:
    fields = {"model": port.served_model_name, "prompt": PROMPT, "temperature": 0, **body}
    return CompletionRequest.model_validate(fields)


async def _events(served: Served[Any]) -> list[dict[str, Any] | str]:
    """Every SSE event: the JSON payloads, then the literal `[DONE]`; the last payload
    must come after the outcome resolved."""
    stream: AsyncIterator[str] = served.reply
    events: list[dict[str, Any] | str] = []
    resolved: list[bool] = []
    async for line in stream:
        assert line.startswith("data: "), line
        assert line.endswith("\n\n"), line
        payload = line[len("data: ") : -2]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
        resolved.append(served.outcome.done())
    assert resolved[-2], "the outcome must resolve before the stream's last chunk"
    return events


async def models_list_the_served_name(h: PortHarness) -> None:
    listed = await h.port.models()
    assert [card.id for card in listed.data] == [h.port.served_model_name]


async def chat_reply_carries_usage_and_its_outcome(h: PortHarness) -> None:
    gid = _gid()
    served = await h.port.chat(_chat(h.port, max_tokens=8), k=h.max_depth, gateway_id=gid)
    reply = served.reply
    assert isinstance(reply, ChatCompletionResponse), reply
    assert reply.id.endswith(gid)
    assert reply.model == h.port.served_model_name
    choice = reply.choices[0]
    assert choice.finish_reason in {"length", "stop"}
    assert choice.message.role == "assistant"
    assert choice.message.content is not None  # may be "" where a random model stops at once
    outcome = _resolved(served)
    assert reply.usage.completion_tokens == outcome.output_tokens <= 8
    assert reply.usage.prompt_tokens > 0
    assert outcome.speculation.k == h.max_depth
    # vLLM's per-request `metrics.speculative_decoding` block, the outcome's counts.
    assert reply.metrics is not None
    assert reply.metrics.speculative_decoding is not None
    block = reply.metrics.speculative_decoding.model_dump(exclude_none=True)
    assert block == speculative_decoding(outcome.speculation)
    assert block["num_spec_tokens"] == h.max_depth
    assert block["num_draft_tokens"] == outcome.speculation.draft_tokens


async def chat_stream_is_openai_sse_and_says_what_the_reply_says(h: PortHarness) -> None:
    reply = (await h.port.chat(_chat(h.port, max_tokens=12), k=0, gateway_id=_gid())).reply
    assert isinstance(reply, ChatCompletionResponse)
    gid = _gid()
    request = _chat(h.port, max_tokens=12, stream=True, stream_options={"include_usage": True})
    served = await h.port.chat(request, k=0, gateway_id=gid)
    assert not isinstance(served.reply, ChatCompletionResponse)
    events = await _events(served)
    outcome = _resolved(served)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    assert all(c["object"] == "chat.completion.chunk" and c["id"].endswith(gid) for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    finishes = [c["choices"][0].get("finish_reason") for c in chunks if c["choices"]]
    assert [f for f in finishes if f is not None] == [finishes[-1]]  # exactly one, the last
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == reply.choices[0].message.content
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"]["completion_tokens"] == outcome.output_tokens
    # vLLM's block rides on the usage chunk alone; at k = 0 it counts no verify step.
    assert [c for c in chunks if "metrics" in c] == [usage_chunk]
    block = usage_chunk["metrics"]["speculative_decoding"]
    assert block == speculative_decoding(outcome.speculation)
    assert (block["num_spec_steps"], block["num_draft_tokens"]) == (0, 0)


async def completion_reply_and_stream_agree(h: PortHarness) -> None:
    gid = _gid()
    served = await h.port.completion(_completion(h.port, max_tokens=10), k=1, gateway_id=gid)
    reply = served.reply
    assert isinstance(reply, CompletionResponse), reply
    assert reply.id.endswith(gid)
    assert reply.choices[0].finish_reason in {"length", "stop"}
    assert reply.usage.completion_tokens == _resolved(served).output_tokens
    request = _completion(
        h.port, max_tokens=10, stream=True, stream_options={"include_usage": True}
    )
    streamed = await h.port.completion(request, k=1, gateway_id=_gid())
    assert not isinstance(streamed.reply, CompletionResponse)
    events = await _events(streamed)
    assert events[-1] == "[DONE]"
    chunks = [e for e in events[:-1] if isinstance(e, dict)]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == reply.choices[0].text
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == reply.usage.completion_tokens


def _responses(port: ServingPort, **body: Any) -> ResponsesRequest:
    fields = {"model": port.served_model_name, "input": MESSAGES, "temperature": 0, **body}
    return ResponsesRequest.model_validate(fields)


async def responses_reply_and_stream_agree(h: PortHarness) -> None:
    """A Responses answer under `resp_<gateway id>` with its outcome at depth k; its
    stream is vLLM's typed events, numbered, ending in `response.completed`."""
    gid = _gid()
    served = await h.port.responses(_responses(h.port, max_output_tokens=10), k=1, gateway_id=gid)
    reply = served.reply
    assert isinstance(reply, ResponsesResponse), reply
    assert reply.id == f"resp_{gid}"
    assert reply.status in {"completed", "incomplete"}
    assert reply.usage is not None
    outcome = _resolved(served)
    assert reply.usage.output_tokens == outcome.output_tokens <= 10
    assert outcome.speculation.k == 1
    (message,) = reply.output
    text = message.content[0].text  # type: ignore[union-attr, index]
    sid = _gid()
    streamed = await h.port.responses(
        _responses(h.port, max_output_tokens=10, stream=True), k=1, gateway_id=sid
    )
    assert not isinstance(streamed.reply, ResponsesResponse)
    events = []
    async for line in streamed.reply:
        kind, data = line.removesuffix("\n\n").split("\n", 1)
        event = json.loads(data.removeprefix("data: "))
        assert kind == f"event: {event['type']}"
        if event["type"] == "response.completed":
            assert streamed.outcome.done(), "resolved before response.completed"
        events.append(event)
    assert [e["type"] for e in events[:2]] == ["response.created", "response.in_progress"]
    assert events[-1]["type"] == "response.completed"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == text
    final = events[-1]["response"]
    assert final["id"] == f"resp_{sid}"
    assert final["usage"]["output_tokens"] == _resolved(streamed).output_tokens


async def k_zero_drafts_nothing_and_k_is_clamped_to_the_maximum(h: PortHarness) -> None:
    request = _completion(h.port, max_tokens=6)
    low = _resolved(await h.port.completion(request, k=0, gateway_id=_gid()))
    request = _completion(h.port, max_tokens=6)
    high = _resolved(await h.port.completion(request, k=h.max_depth + 3, gateway_id=_gid()))
    assert low.speculation.k == 0
    assert low.speculation.draft_tokens == 0
    assert high.speculation.k == h.max_depth


async def a_cap_is_taken_with_the_request(h: PortHarness) -> None:
    served = await h.port.chat(_chat(h.port, max_tokens=4), k=1, gateway_id=_gid(), cap=0)
    assert isinstance(served.reply, ChatCompletionResponse)
    assert _resolved(served).speculation.k == 1


async def an_unknown_model_is_a_not_found_error(h: PortHarness) -> None:
    """Answering and `check_model` (asked before classification) refuse it alike."""
    request = _chat(h.port, model="no-such-model")
    with pytest.raises(EngineError) as caught:
        await h.port.chat(request, k=0, gateway_id=_gid())
    assert caught.value.kind is ErrorClass.NOT_FOUND
    assert "no-such-model" in str(caught.value)
    unknown = [
        request,
        _completion(h.port, model="no-such-model"),
        ResponsesRequest.model_validate({"model": "no-such-model", "input": "Hello"}),
    ]
    for each in unknown:
        with pytest.raises(EngineError) as checked:
            await h.port.check_model(each)
        assert checked.value.kind is ErrorClass.NOT_FOUND, type(each).__name__
        assert checked.value.param == "model"
        assert "no-such-model" in str(checked.value)
    await h.port.check_model(_chat(h.port))
    await h.port.check_model(_completion(h.port))
    await h.port.check_model(ChatCompletionRequest.model_validate({"messages": MESSAGES}))


async def _refused(answer: Awaitable[Any]) -> None:
    """A client error: raised as an engine error of the client's class (vLLM answers some
    of its checks with an `ErrorResponse`, some by raising; the backend raises both)."""
    with pytest.raises(EngineError) as caught:
        await answer
    assert caught.value.kind is ErrorClass.INVALID_REQUEST, caught.value


async def a_prompt_over_the_context_is_a_client_error(h: PortHarness) -> None:
    long = " ".join(["river"] * (h.max_model_len + 8))
    await _refused(h.port.completion(_completion(h.port, prompt=long), k=0, gateway_id=_gid()))
    too_many = _chat(h.port, max_tokens=h.max_model_len * 2)
    await _refused(h.port.chat(too_many, k=0, gateway_id=_gid()))


async def a_refused_request_leaves_no_outcome_pending(h: PortHarness) -> None:
    """A request the backend refuses never runs to an end: nothing stays pending."""
    long = " ".join(["river"] * (h.max_model_len + 8))
    await _refused(h.port.completion(_completion(h.port, prompt=long), k=0, gateway_id=_gid()))
    too_many = _chat(h.port, max_tokens=h.max_model_len * 2)
    await _refused(h.port.chat(too_many, k=0, gateway_id=_gid()))
    with pytest.raises(EngineError):
        await h.port.chat(_chat(h.port, model="no-such-model"), k=0, gateway_id=_gid())
    assert len(h.tap) == 0


async def a_stream_closed_early_resolves_or_is_cancelled(h: PortHarness) -> None:
    """A stream its consumer closes after one chunk ends the engine request: the outcome
    is None or an abort, never a finished answer; one the consumer stops waiting for
    (cancels) leaves nothing pending. A stream never read leaves its outcome pending
    (the engine never saw the request) until it is cancelled."""
    request = _chat(h.port, max_tokens=64, stream=True)
    served = await h.port.chat(request, k=h.max_depth, gateway_id=_gid())
    stream = served.reply
    await anext(stream)
    await stream.aclose()
    for _ in range(3):  # a close reaches the engine's stream in a loop turn or two
        await asyncio.sleep(0)
    if served.outcome.done():
        outcome = served.outcome.result()
        assert outcome is None or outcome.finish_reason == "abort", outcome
    unread = await h.port.chat(_chat(h.port, max_tokens=4, stream=True), k=0, gateway_id=_gid())
    for each in (served, unread):
        each.outcome.cancel()
    await unread.reply.aclose()
    await asyncio.sleep(0)  # the cancellation's callback drops the entry
    assert len(h.tap) == 0


async def sampling_defaults(h: PortHarness) -> None:
    port = h.port
    sampled = port.sampling_of(_chat(port, temperature=0.3, min_p=0.2))
    assert sampled.temperature == pytest.approx(0.3)
    assert sampled.min_p == pytest.approx(0.2)
    assert isinstance(sampled.lossless, bool)
    unset = port.sampling_of(
        ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES})
    )
    assert unset.temperature >= 0.0
    assert unset.min_p == 0.0  # neither test model's generation config sets one
    assert unset.lossless == sampled.lossless  # the engine's, whatever the request
    assert port.harmony_messages is False  # neither backend serves gpt-oss in tests


PORT_CONTRACT: dict[str, Callable[[PortHarness], Awaitable[None]]] = {
    f.__name__: f
    for f in (
        models_list_the_served_name,
        chat_reply_carries_usage_and_its_outcome,
        chat_stream_is_openai_sse_and_says_what_the_reply_says,
        completion_reply_and_stream_agree,
        responses_reply_and_stream_agree,
        k_zero_drafts_nothing_and_k_is_clamped_to_the_maximum,
        a_cap_is_taken_with_the_request,
        an_unknown_model_is_a_not_found_error,
        a_prompt_over_the_context_is_a_client_error,
        a_refused_request_leaves_no_outcome_pending,
        a_stream_closed_early_resolves_or_is_cancelled,
        sampling_defaults,
    )
}
