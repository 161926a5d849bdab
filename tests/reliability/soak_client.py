"""The chaos soak's client side: request bodies, and how each request ended.

Every request is classified into exactly one terminal state as the client saw
it. `complete`, `http_error` (an OpenAI-shaped error before the first byte),
`sse_error` (an error event that ends a stream), `refused` (no connection, so
nothing was sent) and `client_left` (the soak disconnected on purpose) honour
the contract; `truncated`, `fake_success`, `no_terminal` and `closed_early`
(the server closed the connection without a response) do not.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

OK_FINISH = frozenset({"stop", "length", "tool_calls"})
GOOD = frozenset({"complete", "http_error", "sse_error", "refused", "client_left"})
#: Put in every prompt; the soak asserts it never reaches a replica's log.
SOAK_MARKER = "ZQXJVSOAK"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                "required": ["city"],
            },
        },
    }
]


@dataclass
class Planned:
    """One soak request: where it goes, what it sends, and how the client behaves."""

    index: int
    kind: str
    body: dict[str, Any]
    leave_after_events: int | None = None  # streams: disconnect after this many events
    leave_after_s: float | None = None  # non-streams: give up after this long
    read_delay_s: float = 0.0  # slow client: sleep between events


@dataclass
class Ended:
    index: int
    kind: str
    replica: str
    state: str
    detail: str = ""
    left_at: float | None = None
    events: int = 0
    status: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def plan_request(index: int, rng: random.Random) -> Planned:
    prompt = f"{SOAK_MARKER}-{index} Explain topic {rng.randint(0, 999)} in Python."
    chat: dict[str, Any] = {
        "model": "specgw-default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": rng.choice([8, 16, 32, 48]),
    }
    roll = rng.random()
    if roll < 0.30:
        return Planned(index, "chat_stream", {**chat, "stream": True})
    if roll < 0.50:
        return Planned(index, "chat", chat)
    if roll < 0.62:
        body = {"model": "specgw-default", "prompt": prompt, "max_tokens": chat["max_tokens"]}
        stream = rng.random() < 0.5
        return Planned(
            index, "completion_stream" if stream else "completion", {**body, "stream": stream}
        )
    if roll < 0.80:
        stream = rng.random() < 0.5
        body = {**chat, "tools": TOOLS, "tool_choice": "auto", "stream": stream}
        return Planned(index, "tools_stream" if stream else "tools", body)
    long = {**chat, "max_tokens": 1500, "ignore_eos": True}
    if rng.random() < 0.7:
        return Planned(
            index, "leave_stream", {**long, "stream": True}, leave_after_events=rng.randint(0, 20)
        )
    return Planned(index, "leave", long, leave_after_s=rng.uniform(0.05, 1.5))


def slow_request(index: int) -> Planned:
    prompt = f"{SOAK_MARKER}-slow-{index} Tell a long story."
    body = {
        "model": "specgw-default",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 96,
        "ignore_eos": True,
        "stream": True,
    }
    return Planned(index, "slow_stream", body, read_delay_s=0.05)


def classify_stream(events: list[str]) -> tuple[str, str]:
    """(state, detail) of a stream that the server ended."""
    finish: str | None = None
    for i, event in enumerate(events):
        if event == "[DONE]":
            if i != len(events) - 1:
                return "fake_success", "events after [DONE]"
            if finish in OK_FINISH:
                return "complete", finish or ""
            return "fake_success", f"[DONE] after finish_reason={finish!r}"
        payload = json.loads(event)
        if "error" in payload:
            if i != len(events) - 1:
                return "fake_success", "events after an error event"
            return "sse_error", str(payload["error"].get("code"))
        for choice in payload.get("choices", []):
            finish = choice.get("finish_reason") or finish
    return "truncated", f"{len(events)} events, no [DONE] and no error event"


async def run_request(
    client: httpx.AsyncClient, replica: str, planned: Planned, timeout_s: float
) -> Ended:
    """Send one request and classify its end; never raises."""
    ended = Ended(planned.index, planned.kind, replica, "no_terminal")
    path = "/v1/completions" if planned.kind.startswith("completion") else "/v1/chat/completions"
    try:
        if planned.body.get("stream"):
            await asyncio.wait_for(_stream(client, path, planned, ended), timeout_s)
        elif planned.leave_after_s is not None:
            try:
                response = await asyncio.wait_for(
                    client.post(path, json=planned.body), planned.leave_after_s
                )
            except TimeoutError:
                ended.state, ended.left_at = "client_left", time.monotonic()
            else:
                _classify_json(response, ended)
        else:
            response = await asyncio.wait_for(client.post(path, json=planned.body), timeout_s)
            _classify_json(response, ended)
    except TimeoutError:
        ended.state, ended.detail = "no_terminal", f"no end within {timeout_s} s"
    except httpx.ConnectError as exc:
        ended.state, ended.detail = "refused", repr(exc)
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        ended.state = "truncated" if ended.events else "closed_early"
        ended.detail = repr(exc)
    return ended


def _classify_json(response: httpx.Response, ended: Ended) -> None:
    ended.status = response.status_code
    body = response.json()
    if response.status_code == 200:
        finish = body["choices"][0].get("finish_reason")
        ended.state = "complete" if finish in OK_FINISH else "fake_success"
        ended.detail = str(finish)
    elif "error" in body and body["error"].get("message"):
        ended.state, ended.detail = "http_error", f"{response.status_code} {body['error']['code']}"
    else:
        ended.state, ended.detail = "fake_success", f"{response.status_code} without error body"


async def _stream(client: httpx.AsyncClient, path: str, planned: Planned, ended: Ended) -> None:
    async with client.stream("POST", path, json=planned.body) as response:
        ended.status = response.status_code
        if response.status_code != 200:
            _classify_json_bytes(response.status_code, await response.aread(), ended)
            return
        events: list[str] = []
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            ended.events = len(events)
            if planned.leave_after_events is not None and len(events) > planned.leave_after_events:
                ended.state, ended.left_at = "client_left", time.monotonic()
                return  # leaving the block closes the connection mid-stream
            if planned.read_delay_s:
                await asyncio.sleep(planned.read_delay_s)
        ended.state, ended.detail = classify_stream(events)


def _classify_json_bytes(status: int, raw: bytes, ended: Ended) -> None:
    try:
        error = json.loads(raw)["error"]
    except (ValueError, KeyError, TypeError):
        ended.state, ended.detail = "fake_success", f"{status} without an OpenAI error body"
        return
    ended.state, ended.detail = "http_error", f"{status} {error.get('code')}"
