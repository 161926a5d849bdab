"""The OpenAI API on the real engine, driven with the official `openai` client."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.gateway.conftest import ADMIN_KEY, SESSION_CALIBRATION, GatewayProcess
from tests.models import trained_model
from tests.spec_report import check_report, no_report, vllm_block

pytestmark = pytest.mark.engine

MODEL = "specgw-default"
MESSAGES = [
    {"role": "system", "content": "You are a helpful Python assistant."},
    {"role": "user", "content": "What does the json module do?"},
]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city.",
        "strict": True,
        "parameters": {
            "type": "object",
            # An enum keeps the forced JSON short whatever the model is (structured output).
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
        },
    },
}


def test_models_lists_the_served_model(gateway: GatewayProcess) -> None:
    models = gateway.client().models.list()
    assert [m.id for m in models.data] == [MODEL]


def test_chat_non_streaming_reports_speculation(gateway: GatewayProcess) -> None:
    """One report: vLLM's own `metrics.speculative_decoding` (the engine runs at vLLM's
    `detailed` level; the body has no per-step lists at the default `summary`) beside
    the gateway's decision; a request may switch it off."""
    raw = gateway.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0
    )
    completion = raw.parse()
    assert raw.headers["x-request-id"]
    k = int(raw.headers["x-specgw-k"])
    assert raw.headers["x-specgw-class"]
    choice = completion.choices[0]
    assert choice.finish_reason in {"stop", "length"}
    assert completion.usage is not None
    assert completion.usage.completion_tokens > 0
    block = check_report(completion.model_extra, k, raw.headers["x-specgw-class"])
    assert block["num_spec_tokens"] > 0  # the engine's drafter depth
    print("plain chat body:", json.dumps(raw.http_response.json()))  # shown with -s
    off = gateway.client().chat.completions.create(
        model=MODEL,
        messages=MESSAGES,
        max_tokens=4,
        temperature=0,
        extra_body={"speculation_report": "none"},
    )
    no_report(off.model_extra)


def test_usage_reports_prompt_tokens_served_from_the_prefix_cache(gateway: GatewayProcess) -> None:
    """OpenAI's `usage.prompt_tokens_details.cached_tokens`, streamed and not. k = 0 and
    k > 0 requests keep apart in the prefix cache (`engine.vllm.scheduler`), so the repeat
    that counts is one at the same k as the request before it."""
    notes = " ".join(f"Rule {i}: answer in {i % 5 + 1} words." for i in range(60))
    messages = [
        {"role": "system", "content": f"{time.time_ns()} {notes}"},
        {"role": "user", "content": "Which rule is first?"},
    ]
    client = gateway.client()
    seen: list[tuple[int, int, int]] = []  # (k, prompt tokens, cached tokens)
    for _ in range(5):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages, max_tokens=4, temperature=0
        )
        usage = raw.parse().usage
        assert usage is not None
        assert usage.prompt_tokens_details is not None
        cached = usage.prompt_tokens_details.cached_tokens or 0
        seen.append((int(raw.headers["x-specgw-k"]), usage.prompt_tokens, cached))
        if len(seen) >= 2 and seen[-1][0] == seen[-2][0]:
            break
    assert seen[0][2] == 0, seen  # a fresh system prompt
    k, prompt_tokens, cached = seen[-1]
    assert seen[-2][0] == k, seen
    assert 128 <= cached < prompt_tokens, seen  # whole blocks, the last token recomputed
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    usages = [chunk.usage for chunk in stream if chunk.usage is not None]
    assert usages[-1].prompt_tokens == prompt_tokens
    assert usages[-1].prompt_tokens_details is not None
    assert usages[-1].prompt_tokens_details.cached_tokens is not None


def test_admin_reset_empties_the_prefix_cache(gateway: GatewayProcess) -> None:
    """After `POST /admin/prefix-cache/reset` a prompt the engine had cached is cold
    again, at any k (both cache namespaces go); a user key cannot reset."""
    notes = " ".join(f"Clause {i}: reply in {i % 4 + 2} words." for i in range(60))
    messages = [
        {"role": "system", "content": f"{time.time_ns()} {notes}"},
        {"role": "user", "content": "Which clause is last?"},
    ]
    client = gateway.client()

    def cached_tokens() -> int:
        usage = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=4, temperature=0
        ).usage
        assert usage is not None
        assert usage.prompt_tokens_details is not None
        return usage.prompt_tokens_details.cached_tokens or 0

    warm = [cached_tokens() for _ in range(4)]
    assert max(warm) >= 128, warm  # the prompt is in the cache (at some k)
    with gateway.http() as http:
        assert http.post("/admin/prefix-cache/reset").status_code == 403
    with gateway.http(ADMIN_KEY) as http:
        answer = http.post("/admin/prefix-cache/reset")
    assert answer.status_code == 200
    assert answer.json() == {"object": "prefix_cache", "reset": True}
    assert cached_tokens() == 0


def test_stream_matches_non_stream_and_ends_with_done(gateway: GatewayProcess) -> None:
    client = gateway.client()
    full = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=24, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in {"stop", "length"}
    last = chunks[-1]
    assert last.usage is not None
    assert last.usage.completion_tokens > 0
    # The raw stream ends with [DONE] (the SDK consumes it silently); its usage chunk
    # carries the one report, as a reply's body does.
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 8, "stream": True}
    body["stream_options"] = {"include_usage": True}
    with (
        gateway.http() as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        k, label = int(response.headers["x-specgw-k"]), response.headers["x-specgw-class"]
        lines = [line for line in response.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    usage_chunk = json.loads(lines[-2].removeprefix("data: "))
    assert usage_chunk["choices"] == []
    check_report(usage_chunk, k, label)
    assert [line for line in lines if '"speculative_decoding"' in line] == [lines[-2]]
    print("streamed chat usage chunk:", lines[-2])  # shown with -s


def test_completions(gateway: GatewayProcess) -> None:
    completion = gateway.client().completions.create(
        model=MODEL, prompt="def parse_args(argv):\n", max_tokens=16, temperature=0
    )
    assert completion.choices[0].finish_reason in {"stop", "length"}
    assert completion.model_extra["speculation"]["k"] >= 0
    vllm_block(completion.model_extra)


@pytest.mark.skipif(
    not trained_model(),
    reason="a random-weight model pads forced JSON with whitespace until max_tokens",
)
def test_named_tool_call_round_trip(gateway: GatewayProcess) -> None:
    client = gateway.client()
    first = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=48,
        temperature=0,
    )
    calls = first.choices[0].message.tool_calls
    assert calls
    assert calls[0].function.name == "get_weather"
    json.loads(calls[0].function.arguments)  # structured output: always valid JSON
    second = client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [calls[0].model_dump()]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": '{"temp_c": 21}'},
        ],
        tools=[WEATHER_TOOL],
        max_tokens=16,
        temperature=0,
    )
    assert second.choices[0].finish_reason in {"stop", "length", "tool_calls"}


@pytest.mark.skipif(not trained_model(), reason="a random-weight model emits no tool calls")
def test_tool_choice_auto_is_parsed_by_the_hermes_parser(gateway: GatewayProcess) -> None:
    """The model's own `<tool_call>` text comes back as `tool_calls` (not as content)."""
    from tools.model.corpus import load_corpus
    from tools.model.families import family_prompts

    parsed = []
    for prompt in family_prompts(load_corpus(), "tool_call", n=4):
        completion = gateway.client().chat.completions.create(
            model=MODEL,
            messages=prompt.messages,  # type: ignore[arg-type]
            tools=prompt.tools,  # type: ignore[arg-type]
            tool_choice="auto",
            max_tokens=64,
            temperature=0,
        )
        choice = completion.choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            for call in choice.message.tool_calls:
                # A 3.4 M-parameter model may call a tool it was not offered; what this
                # checks is the parsing: a name and JSON arguments, not the model's choice.
                assert call.function.name.isidentifier(), call.function.name
                json.loads(call.function.arguments)
            parsed.append(completion.model_extra["speculation"]["class"])
    assert parsed, "no tool call parsed from any of the four tool-call prompts"


def test_json_object_response_format(gateway: GatewayProcess) -> None:
    completion = gateway.client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Reply with a JSON object."}],
        response_format={"type": "json_object"},
        max_tokens=48,
        temperature=0,
    )
    choice = completion.choices[0]
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content or ""), dict)
    else:
        assert (choice.message.content or "").lstrip().startswith("{")


@pytest.mark.parametrize(
    ("key", "status"),
    [(None, 401), ("sk-wrong", 401), (ADMIN_KEY, 403)],
)
def test_v1_refuses_bad_keys(gateway: GatewayProcess, key: str | None, status: int) -> None:
    with gateway.http(key) as http:
        for method, path in [("GET", "/v1/models"), ("POST", "/v1/chat/completions")]:
            response = http.request(method, path, json={"model": MODEL, "messages": MESSAGES})
            assert response.status_code == status, path
            assert response.json()["error"]["type"] in {
                "authentication_error",
                "permission_error",
            }
            assert response.headers["x-request-id"]


def _error(gateway: GatewayProcess, body: dict[str, object]) -> httpx.Response:
    with gateway.http() as http:
        return http.post("/v1/chat/completions", json=body)


@pytest.mark.parametrize(
    ("body", "status", "param_hint"),
    [
        ({"model": MODEL, "messages": "hi"}, 400, "messages"),
        ({"model": MODEL, "messages": MESSAGES, "max_tokens": "ten"}, 400, "max_tokens"),
        ({"model": MODEL, "messages": MESSAGES, "max_tokens": 10_000_000}, 400, None),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x " * 6000}]}, 400, None),
        ({"model": "no-such-model", "messages": MESSAGES}, 404, None),
        (
            {"model": MODEL, "messages": MESSAGES, "tools": [{"type": "function"}]},
            400,
            "tools",
        ),
        (
            {"model": MODEL, "messages": MESSAGES, "vllm_xargs": {"specgw_k": 4}},
            400,
            "vllm_xargs",
        ),
        ({"model": MODEL, "messages": [{"role": "user", "content": "a\x00b"}]}, 400, None),
    ],
)
def test_invalid_requests_get_openai_errors(
    gateway: GatewayProcess, body: dict[str, object], status: int, param_hint: str | None
) -> None:
    response = _error(gateway, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    if param_hint:
        assert param_hint in (error["param"] or error["message"])


def test_client_cannot_set_its_own_depth(gateway: GatewayProcess) -> None:
    client = gateway.client()
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            max_tokens=4,
            extra_body={"vllm_xargs": {"specgw_k": 0}},
        )


def test_client_disconnect_aborts_engine_request(gateway: GatewayProcess) -> None:
    with (
        gateway.http() as http,
        http.stream(
            "POST",
            "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": MESSAGES,
                "max_tokens": 1500,
                "stream": True,
                "ignore_eos": True,
            },
        ) as response,
    ):
        for i, _ in enumerate(response.iter_lines()):
            if i == 6:
                assert gateway.engine_requests() >= 1
                break
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline and gateway.engine_requests() > 0:
        time.sleep(0.1)
    assert gateway.engine_requests() == 0


def test_step_costs_are_calibrated_before_ready(gateway: GatewayProcess) -> None:
    """The gateway measured every depth at the calibration batch sizes at start-up; the
    cost model has them, so the policy starts from the host's own costs, not the prior's."""
    batches = SESSION_CALIBRATION
    with gateway.http(ADMIN_KEY) as http:
        report = http.get("/admin/costs").json()
    points = {(p["batch"], p["k"]): p for p in report["calibration"]}
    depths = range(len(report["buckets"][0]["relative_cost"]))
    assert set(points) == {(b, k) for b in batches for k in depths}
    assert all(p["samples"] >= 3 and p["step_ms"] > 0 for p in points.values())
    # Timed by the engine's step clock, as traffic's steps are (`gateway.calibration`).
    assert {p["timed_by"] for p in points.values()} == {"steps"}
    deepest = max(depths)
    assert points[(1, deepest)]["step_ms"] > points[(1, 0)]["step_ms"]  # drafts cost time
    # Every depth's first token was timed. Not compared: whether the drafter's prefill
    # shows is the machine's (on one CPU host 26 ms at k = 5 against 28 ms at k = 0,
    # within the noise; on a slower one 70 against 32 ms).
    assert all(p["ttft_ms"] > 0 for p in points.values())
    buckets = {b["batch_bucket"]: b for b in report["buckets"]}
    for bucket in batches:
        assert buckets[bucket]["relative_cost"][0] == 1.0
        assert min(buckets[bucket]["samples"]) >= 3  # no depth left for traffic to probe
        assert len(buckets[bucket]["first_token"]) == len(depths)
    # A cold prompt token's prefill, which prices a k = 0 class's probe of k = 1.
    assert report["prefill_ms_per_token"] > 0
    with gateway.http() as http:  # a user key does not reach it
        assert http.get("/admin/costs").status_code == 403
