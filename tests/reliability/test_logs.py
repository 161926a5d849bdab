"""No prompt or completion text in the gateway's logs (content logging is off by default).

Prompts carry distinctive markers through every path that could log them: a
chat answer, a stream, a completion, a tool-call request, stop strings, a
request refused by a limit, a malformed body, and a stream the client leaves
mid-way. The gateway process's whole log (stdout + stderr: uvicorn, vLLM and
the gateway's own loggers) must contain neither a marker nor any generated
completion text. The shared gateway's teardown repeats the marker check over
the log of the whole run.
"""

from __future__ import annotations

import json
import re
import time

import httpx
import pytest

from tests.gateway.conftest import GatewayProcess
from tests.reliability.conftest import MARKER

pytestmark = pytest.mark.engine


def marker(n: int) -> str:
    return f"{MARKER}{n:04d}QPW"


def _completion_texts(body: dict[str, object]) -> list[str]:
    out: list[str] = []
    for choice in body.get("choices", []):  # type: ignore[attr-defined]
        message = choice.get("message") or {}
        text = choice.get("text") or message.get("content") or ""
        out.append(text)
    return out


def _distinctive(text: str) -> bool:
    """Long enough that its appearance in a log cannot be a coincidence."""
    return len(text.strip()) >= 16 and len(re.sub(r"\W", "", text)) >= 4


def _drive(gw: GatewayProcess) -> tuple[list[str], list[str]]:
    markers: list[str] = []
    generated: list[str] = []

    def m() -> str:
        markers.append(marker(len(markers)))
        return markers[-1]

    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": m(),
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
        },
    }
    with gw.http() as http:
        chat = {"model": "specgw-default", "max_tokens": 48, "ignore_eos": True}
        for body in (
            {
                **chat,
                "messages": [{"role": "system", "content": m()}, {"role": "user", "content": m()}],
            },
            {**chat, "messages": [{"role": "user", "content": m()}], "tools": [tool]},
            {**chat, "messages": [{"role": "user", "content": m()}], "stop": [m()]},
        ):
            response = http.post("/v1/chat/completions", json=body)
            assert response.status_code == 200, response.text
            generated += _completion_texts(response.json())
        response = http.post(
            "/v1/completions", json={"model": "specgw-default", "prompt": m(), "max_tokens": 48}
        )
        assert response.status_code == 200
        generated += _completion_texts(response.json())
        stream = {**chat, "messages": [{"role": "user", "content": m()}], "stream": True}
        with http.stream("POST", "/v1/chat/completions", json=stream) as r:
            parts = []
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:]).get("choices", []):
                        parts.append(choice.get("delta", {}).get("content") or "")
            generated.append("".join(parts))
        # Refused by a limit, and malformed: the error message must not echo the text.
        bad = {**chat, "messages": [{"role": "user", "content": m() + "\x00"}]}
        assert http.post("/v1/chat/completions", json=bad).status_code == 400
        broken = ('{"model": "specgw-default", "messages": [{"content": "' + m()).encode()
        assert http.post("/v1/chat/completions", content=broken).status_code in (400, 422)
        # A client that leaves mid-stream.
        long = {**stream, "messages": [{"role": "user", "content": m()}], "max_tokens": 400}
        with http.stream("POST", "/v1/chat/completions", json=long) as r:
            for i, _ in enumerate(r.iter_lines()):
                if i > 5:
                    break
    return markers, [g for g in generated if _distinctive(g)]


def test_logs_hold_no_prompt_or_completion_text(shared_gateway: GatewayProcess) -> None:
    markers, generated = _drive(shared_gateway)
    time.sleep(1.0)  # let the last request's log lines land
    log = shared_gateway.log_path.read_text(errors="replace")
    assert "request finished" in log  # the gateway does log each request, without content
    # ... with its class, depth, the controller's reason and its status as fields.
    finished = [line for line in log.splitlines() if " request finished " in line]
    assert finished
    assert all(
        " class=" in line and " k=" in line and " reason=" in line and " status=" in line
        for line in finished
    ), finished[:3]
    leaked = [m for m in markers if m in log]
    assert not leaked, leaked
    assert generated, "no distinctive completion text to look for"
    leaked_out = [g for g in generated if g.strip() in log]
    assert not leaked_out, leaked_out
    with httpx.Client(base_url=shared_gateway.base_url) as plain:
        assert MARKER not in plain.get("/metrics").text
