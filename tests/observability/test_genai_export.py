"""Traces as they leave the gateway: the whole gateway in process on the fake backend,
exporting with its real OTLP/HTTP exporter to a receiver on a loopback port.

What is asserted is what a collector gets: the GenAI inference span (name, kind,
attributes by the OpenTelemetry GenAI conventions) under the HTTP server span, the
resource's `service.name` from `OTEL_SERVICE_NAME`, the exporter's headers from
`OTEL_EXPORTER_OTLP_HEADERS`, the sampler from `OTEL_TRACES_SAMPLER`; and the log line
of each request carrying its request id and the trace id of those spans.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import pytest
from openai.types.chat import ChatCompletionMessageParam

from engine.fake import AcceptanceScript, FakeEngineConfig
from gateway.observability.events import DECISION_EVENT
from gateway.observability.logs import FieldsFormatter, RequestContextFilter
from tests.observability.otlp_receiver import OtlpReceiver, ReceivedSpan, running
from tests.unit.conftest import MODEL, InProcessGateway, serve_in_process

pytestmark = pytest.mark.asyncio(loop_scope="session")

PROMPT = "the secret prompt text about herons"
MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": PROMPT}]
OTEL_VARIABLES = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_SERVICE_NAME",
    "OTEL_RESOURCE_ATTRIBUTES",
    "OTEL_TRACES_SAMPLER",
    "OTEL_TRACES_SAMPLER_ARG",
    "OTEL_TRACES_EXPORTER",
    "OTEL_SDK_DISABLED",
)


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[OtlpReceiver]:
    """A receiver, and an environment that names nothing but what each test sets."""
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with running() as started:
        yield started


@asynccontextmanager
async def traced_gateway(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], engine: FakeEngineConfig | None = None
) -> AsyncIterator[InProcessGateway]:
    """The in-process gateway, tracing configured by `env` alone; leaving it flushes the
    exporter (the app's lifespan shuts the tracer provider down)."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    async with serve_in_process(engine=engine) as gw:
        yield gw


@contextmanager
def request_log() -> Iterator[io.StringIO]:
    """The gateway's log lines as `configure_logging` writes them (formatter and filter)."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(FieldsFormatter("%(levelname)s %(name)s %(message)s"))
    handler.addFilter(RequestContextFilter())
    logger = logging.getLogger("specgw")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield buf
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def by_kind(spans: list[ReceivedSpan], kind: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.kind == kind]


def fields(line: str) -> dict[str, str]:
    """The `key=value` fields of a log line (values here are never quoted)."""
    return dict(part.split("=", 1) for part in line.split() if "=" in part)


async def test_chat_exports_a_genai_inference_span_under_the_http_span(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url, "OTEL_SERVICE_NAME": "gw-east-1"}
    async with traced_gateway(monkeypatch, env) as gw:
        raw = await gw.client().chat.completions.with_raw_response.create(
            model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, top_p=0.9, seed=7
        )
        reply = raw.parse()
    spans = receiver.wait_for(lambda got: len(got) >= 2)
    (server,) = by_kind(spans, "SERVER")
    (inference,) = by_kind(spans, "INTERNAL")
    assert server.name == "POST /v1/chat/completions"
    assert inference.name == f"chat {MODEL}"
    assert (inference.trace_id, inference.parent_span_id) == (server.trace_id, server.span_id)
    attrs = inference.attributes
    assert reply.usage is not None
    assert reply.model_extra is not None
    block = reply.model_extra["metrics"]["speculative_decoding"]
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "vllm"
    assert attrs["gen_ai.request.model"] == MODEL
    assert attrs["gen_ai.response.model"] == MODEL
    assert attrs["gen_ai.request.max_tokens"] == 12
    assert attrs["gen_ai.request.temperature"] == 0.0
    assert attrs["gen_ai.request.top_p"] == 0.9
    assert attrs["gen_ai.request.seed"] == 7
    assert attrs["gen_ai.response.id"] == reply.id
    assert attrs["gen_ai.response.finish_reasons"] == [reply.choices[0].finish_reason]
    assert attrs["gen_ai.usage.input_tokens"] == reply.usage.prompt_tokens
    assert attrs["gen_ai.usage.output_tokens"] == reply.usage.completion_tokens == 12
    assert attrs["specgw.class"] == raw.headers["x-specgw-class"]
    assert attrs["specgw.k"] == int(raw.headers["x-specgw-k"])
    assert attrs["specgw.reason"]
    assert attrs["specgw.acceptance_length"] == pytest.approx(block["mean_acceptance_length"])
    assert attrs["specgw.verify_steps"] == block["num_spec_steps"]
    assert "gen_ai.request.stream" not in attrs
    assert "gen_ai.response.time_to_first_chunk" not in attrs  # streams only
    assert "gen_ai.request.stop_sequences" not in attrs  # the request set none
    assert inference.status == "UNSET"
    # The HTTP span is the HTTP layer's: no GenAI attributes on it.
    assert not [key for key in server.attributes if key.startswith(("gen_ai.", "specgw."))]
    assert server.resource["service.name"] == inference.resource["service.name"] == "gw-east-1"
    assert PROMPT.encode() not in b"".join(receiver.bodies)
    assert reply.choices[0].message.content
    assert reply.choices[0].message.content.encode() not in b"".join(receiver.bodies)


async def test_a_streamed_completion_is_one_text_completion_span(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint}
    async with traced_gateway(monkeypatch, env) as gw:
        started = time.monotonic()
        stream = await gw.client().completions.create(
            model=MODEL,
            prompt="tell a story",
            max_tokens=30,
            temperature=0,
            stop=["THE END", "\n\n\n"],  # the fake's words never match: 30 tokens still
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [chunk async for chunk in stream]
        exchange_s = time.monotonic() - started
    spans = receiver.wait_for(lambda got: len(got) >= 2)
    # One server span and one inference span: no span per SSE chunk.
    assert sorted((s.name, s.kind) for s in spans) == [
        ("POST /v1/completions", "SERVER"),
        (f"text_completion {MODEL}", "INTERNAL"),
    ]
    (inference,) = by_kind(spans, "INTERNAL")
    attrs = inference.attributes
    usage = chunks[-1].usage
    assert usage is not None
    assert attrs["gen_ai.operation.name"] == "text_completion"
    assert attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.response.id"] == chunks[0].id
    assert attrs["gen_ai.usage.output_tokens"] == usage.completion_tokens == 30
    assert attrs["gen_ai.response.finish_reasons"] == ["length"]
    assert attrs["gen_ai.request.stop_sequences"] == ["THE END", "\n\n\n"]
    # From the request's arrival to its first chunk: within the client's whole exchange.
    assert 0 < attrs["gen_ai.response.time_to_first_chunk"] < exchange_s
    assert inference.resource["service.name"] == "spec-gateway"  # the default


async def test_a_refused_request_ends_its_span_with_the_error(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request the backend refuses after admission (here: a prompt over the context) is
    an inference span with status ERROR and the gateway's error code as `error.type`."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url}
    async with traced_gateway(monkeypatch, env) as gw:
        r = await gw.http.post(
            "/v1/completions",
            headers=gw.auth("sk-unit-user"),
            json={"model": MODEL, "prompt": "word " * 2100, "max_tokens": 4},
        )
    assert r.status_code == 400, r.text
    spans = receiver.wait_for(lambda got: len(got) >= 2)
    (inference,) = by_kind(spans, "INTERNAL")
    assert inference.name == f"text_completion {MODEL}"
    assert inference.status == "ERROR"
    assert inference.attributes["error.type"] == r.json()["error"]["code"] == "invalid_request"
    assert inference.attributes["gen_ai.response.finish_reasons"] == ["error"]


async def test_an_unknown_model_has_no_inference_span(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused before it is classified: the server span says 404, and no inference span
    claims a model call that never happened."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url}
    async with traced_gateway(monkeypatch, env) as gw:
        r = await gw.http.post(
            "/v1/chat/completions",
            headers=gw.auth("sk-unit-user"),
            json={"model": "no-such-model", "messages": MESSAGES, "max_tokens": 4},
        )
    assert r.status_code == 404
    spans = receiver.wait_for(lambda got: len(by_kind(got, "SERVER")) >= 1)
    (server,) = by_kind(spans, "SERVER")
    assert server.attributes["http.status_code"] == 404, server.attributes
    assert by_kind(spans, "INTERNAL") == []


async def test_the_log_line_of_a_request_carries_its_request_id_and_trace_id(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url}
    with request_log() as log:
        async with traced_gateway(monkeypatch, env) as gw:
            raw = await gw.client().chat.completions.with_raw_response.create(
                model=MODEL,
                messages=MESSAGES,
                max_tokens=4,
                extra_headers={"x-request-id": "req-trace-1"},
            )
    assert raw.headers["x-request-id"] == "req-trace-1"
    spans = receiver.wait_for(lambda got: len(got) >= 2)
    (server,) = by_kind(spans, "SERVER")
    (line,) = [ln for ln in log.getvalue().splitlines() if "request finished" in ln]
    found = fields(line)
    assert found["request_id"] == "req-trace-1"
    assert found["trace_id"] == server.trace_id
    assert found["span_id"] in {s.span_id for s in spans}
    assert PROMPT not in log.getvalue()


async def test_a_caller_trace_is_joined_from_its_traceparent(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url}
    async with traced_gateway(monkeypatch, env) as gw:
        await gw.client().completions.create(
            model=MODEL,
            prompt="hello",
            max_tokens=2,
            extra_headers={"traceparent": f"00-{trace_id}-{parent}-01"},
        )
    spans = receiver.wait_for(lambda got: len(got) >= 2)
    (server,) = by_kind(spans, "SERVER")
    assert {s.trace_id for s in spans} == {trace_id}
    assert server.parent_span_id == parent


async def test_exporter_headers_come_from_the_environment(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url,
        "OTEL_EXPORTER_OTLP_HEADERS": "authorization=Bearer%20tenant-token,x-scope-orgid=team-a",
    }
    async with traced_gateway(monkeypatch, env) as gw:
        await gw.client().completions.create(model=MODEL, prompt="hi", max_tokens=2)
    receiver.wait_for(lambda got: len(got) >= 2)
    assert receiver.headers[0]["authorization"] == "Bearer tenant-token"
    assert receiver.headers[0]["x-scope-orgid"] == "team-a"
    assert receiver.headers[0]["content-type"] == "application/x-protobuf"


async def test_the_sampler_from_the_environment_drops_traces_but_not_log_ids(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url, "OTEL_TRACES_SAMPLER": "always_off"}
    with request_log() as log:
        async with traced_gateway(monkeypatch, env) as gw:
            await gw.client().completions.create(model=MODEL, prompt="hi", max_tokens=2)
    assert receiver.spans == []
    (line,) = [ln for ln in log.getvalue().splitlines() if "request finished" in ln]
    assert len(fields(line)["trace_id"]) == 32  # a dropped trace still has its id


async def test_decision_changes_are_events_of_the_inference_span(
    receiver: OtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drafts that are never accepted drive the class's k down: the controller's decision
    changes fire inside the request that caused them, on its inference span."""
    engine = FakeEngineConfig(scripts=(AcceptanceScript("[hard]", (0.02, 0.02, 0.02, 0.02)),))
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base_url}
    depths: list[int] = []
    async with traced_gateway(monkeypatch, env, engine) as gw:
        client = gw.client()
        for i in range(16):
            raw = await client.completions.with_raw_response.create(
                model=MODEL, prompt=f"[hard] prose {i}", max_tokens=24, temperature=0
            )
            depths.append(int(raw.headers["x-specgw-k"]))
    spans = receiver.wait_for(lambda got: len(got) >= 32)
    assert len(set(depths)) > 1, depths  # the premise: k changed
    events: list[tuple[str, dict[str, Any]]] = [e for s in spans for e in s.events]
    decisions = [attrs for name, attrs in events if name == DECISION_EVENT]
    assert decisions
    on_inference = [e for s in by_kind(spans, "INTERNAL") for e in s.events]
    assert len([e for e in on_inference if e[0] == DECISION_EVENT]) == len(decisions)
    assert {d["specgw.class"] for d in decisions} == {
        s.attributes["specgw.class"] for s in by_kind(spans, "INTERNAL")
    }
