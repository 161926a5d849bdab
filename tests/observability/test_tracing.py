"""Tracing: one server span per request from the FastAPI instrumentation, annotated with
GenAI attributes and control events, never with prompt or completion text."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.control.events import DecisionChange, DriftEvent
from gateway.observability.events import DECISION_EVENT, DRIFT_EVENT, SpanEvents
from gateway.observability.tracing import GenAIAttributes, annotate_span, setup_tracing

PROMPT = "the secret prompt text"
COMPLETION = "the secret completion text"
STREAM_CHUNKS = 40


@dataclass(frozen=True)
class Settings:
    otel_endpoint: str | None = None


def tiny_app() -> FastAPI:
    """A stand-in for the gateway's chat route: it annotates the span as the service does."""
    app = FastAPI()
    events = SpanEvents()

    @app.post("/v1/chat/completions")
    async def chat(body: dict[str, object]) -> dict[str, object]:
        annotate_span(
            GenAIAttributes(
                operation="chat",
                model="specgw-tiny",
                cls="chat/len:512",
                class_id="0123456789abcdef",
                k=3,
                response_id="chatcmpl-1",
                max_tokens=16,
                temperature=0.0,
                input_tokens=12,
                output_tokens=16,
                finish_reasons=("length",),
                acceptance_length=2.25,
                verify_steps=7,
            )
        )
        events.on_decision_change(
            DecisionChange("0123456789abcdef", "chat/len:512", 1, 2, 3, "goodput +9%", (1.0,))
        )
        events.on_drift(
            DriftEvent("0123456789abcdef", "chat/len:512", -1, 2.5, 1.4, (0.8,), (0.4,), 30)
        )
        return {"choices": [{"message": {"content": COMPLETION}}]}

    @app.post("/v1/completions")
    async def stream() -> StreamingResponse:
        async def chunks() -> AsyncIterator[str]:
            for i in range(STREAM_CHUNKS):
                yield f"data: {i}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    @app.get("/metrics")
    async def metrics() -> str:
        return ""

    return app


async def call(app: FastAPI) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        r = await client.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": PROMPT}]}
        )
        assert r.status_code == 200
        assert (await client.get("/metrics")).status_code == 200


async def test_request_span_carries_genai_attributes_and_events() -> None:
    exporter = InMemorySpanExporter()
    app = tiny_app()
    provider = setup_tracing(Settings(), app, exporter=exporter)
    assert provider is not None
    await call(app)
    provider.force_flush()
    spans = exporter.get_finished_spans()
    servers = [s for s in spans if s.kind.name == "SERVER"]
    assert [s.name for s in servers] == ["POST /v1/chat/completions"]  # /metrics not traced
    attrs = dict(servers[0].attributes or {})
    assert attrs["gen_ai.request.model"] == "specgw-tiny"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.usage.input_tokens"] == 12
    assert attrs["gen_ai.usage.output_tokens"] == 16
    assert tuple(attrs["gen_ai.response.finish_reasons"]) == ("length",)  # type: ignore[arg-type]
    assert attrs["specgw.class"] == "chat/len:512"
    assert attrs["specgw.k"] == 3
    assert attrs["specgw.acceptance_length"] == 2.25
    assert attrs["http.route"] == "/v1/chat/completions"
    events = {e.name: dict(e.attributes or {}) for e in servers[0].events}
    assert events[DECISION_EVENT]["specgw.new_k"] == 3
    assert events[DRIFT_EVENT]["specgw.direction"] == "down"
    everything = repr([(s.attributes, [e.attributes for e in s.events]) for s in spans])
    assert PROMPT not in everything
    assert COMPLETION not in everything
    provider.shutdown()


async def test_a_streamed_reply_is_one_span_not_one_per_chunk() -> None:
    exporter = InMemorySpanExporter()
    app = tiny_app()
    provider = setup_tracing(Settings(), app, exporter=exporter)
    assert provider is not None
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        r = await client.post("/v1/completions", json={})
        assert r.text.count("data: ") == STREAM_CHUNKS + 1
    provider.force_flush()
    spans = exporter.get_finished_spans()
    # Without exclude_spans the ASGI instrumentation adds an internal span per `send`
    # (STREAM_CHUNKS + 2 of them here: the start, every chunk, the end).
    assert [(s.name, s.kind.name) for s in spans] == [("POST /v1/completions", "SERVER")]
    provider.shutdown()


async def test_tracing_is_off_without_an_endpoint() -> None:
    app = tiny_app()
    assert setup_tracing(Settings(), app) is None
    await call(app)  # annotate_span and span events are no-ops without a recording span


def test_an_endpoint_turns_on_the_otlp_exporter() -> None:
    app = FastAPI()
    provider = setup_tracing(Settings("http://127.0.0.1:1/v1/traces"), app)
    assert provider is not None
    processors = provider._active_span_processor._span_processors
    exporter = processors[0].span_exporter  # type: ignore[attr-defined]
    assert type(exporter).__name__ == "OTLPSpanExporter"
    provider.shutdown()
