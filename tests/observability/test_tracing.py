"""Tracing's parts on their own: the server span of the FastAPI instrumentation, the GenAI
inference span (`InferenceSpans`) with its attributes, events and errors, never with
prompt or completion text. `test_genai_export.py` checks the same through the whole
gateway and a real OTLP receiver."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from engine.interface import RequestOutcome, SpeculationOutcome
from engine.protocol import ChatCompletionRequest, CompletionRequest, ResponsesRequest
from gateway.control.events import DecisionChange, DriftEvent
from gateway.control.plane import Plan
from gateway.errors import ErrorKind, GatewayError
from gateway.observability.events import DECISION_EVENT, DRIFT_EVENT, SpanEvents
from gateway.observability.inference_span import (
    InferenceSpans,
    output_type,
    request_attributes,
)
from gateway.observability.tracing import setup_tracing
from gateway.replies import Finished
from tests.observability.otlp_receiver import running

PROMPT = "the secret prompt text"
COMPLETION = "the secret completion text"
STREAM_CHUNKS = 40
PLAN = Plan("0123456789abcdef", "chat/len:512", 3, "goodput +9% at k=3")


class Settings:
    def __init__(self, otel_endpoint: str | None = None) -> None:
        self.otel_endpoint = otel_endpoint


def in_memory() -> tuple[InferenceSpans, InMemorySpanExporter, TracerProvider]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return InferenceSpans(provider.get_tracer("test")), exporter, provider


def outcome(finish_reason: str = "length") -> RequestOutcome:
    return RequestOutcome(
        request_id="r1",
        prompt_tokens=12,
        output_tokens=16,
        finish_reason=finish_reason,
        speculation=SpeculationOutcome(
            k=3, verify_steps=7, draft_tokens=21, accepted_tokens=9, accepted_per_position=(5, 3, 1)
        ),
        cached_prompt_tokens=4,
    )


def finished(status: str, error: GatewayError | None = None, done: bool = True) -> Finished:
    return Finished("chat", PLAN, status, error, outcome() if done else None, 0.3, None, False)


def chat_request(**fields: object) -> ChatCompletionRequest:
    body = {"model": "specgw-tiny", "messages": [{"role": "user", "content": PROMPT}], **fields}
    return ChatCompletionRequest.model_validate(body)


def test_the_inference_span_by_the_genai_conventions() -> None:
    spans, exporter, _ = in_memory()
    request = chat_request(max_completion_tokens=16, temperature=0.0, top_p=0.5, top_k=40)
    span = spans.start("chat", "specgw-tiny", request, PLAN, "chatcmpl-1", stream=False)
    with span.current():
        SpanEvents().on_decision_change(
            DecisionChange("0123456789abcdef", "chat/len:512", 1, 2, 3, "goodput +9%", (1.0,))
        )
        SpanEvents().on_drift(
            DriftEvent("0123456789abcdef", "chat/len:512", -1, 2.5, 1.4, (0.8,), (0.4,), 30)
        )
    span.finish(finished("complete"))
    span.finish(finished("error", GatewayError(ErrorKind.ENGINE_ERROR, "late")))  # no-op
    (done,) = exporter.get_finished_spans()
    assert done.name == "chat specgw-tiny"
    assert done.kind == SpanKind.INTERNAL
    assert done.status.status_code == StatusCode.UNSET
    attrs = dict(done.attributes or {})
    assert attrs == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "specgw-tiny",
        "gen_ai.response.id": "chatcmpl-1",
        "gen_ai.request.max_tokens": 16,
        "gen_ai.request.temperature": 0.0,
        "gen_ai.request.top_p": 0.5,
        "gen_ai.request.top_k": 40,
        "specgw.class": "chat/len:512",
        "specgw.class_id": "0123456789abcdef",
        "specgw.k": 3,
        "specgw.reason": "goodput +9% at k=3",
        "gen_ai.response.model": "specgw-tiny",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 16,
        "gen_ai.usage.cache_read.input_tokens": 4,
        "specgw.acceptance_length": 1 + 9 / 7,
        "specgw.verify_steps": 7,
        "specgw.draft_tokens": 21,
        "specgw.accepted_tokens": 9,
        "gen_ai.response.finish_reasons": ("length",),
    }
    events = {e.name: dict(e.attributes or {}) for e in done.events}
    assert events[DECISION_EVENT]["specgw.new_k"] == 3
    assert events[DRIFT_EVENT]["specgw.direction"] == "down"
    assert PROMPT not in repr(attrs)


def test_a_failed_request_has_status_error_and_the_error_code() -> None:
    spans, exporter, _ = in_memory()
    span = spans.start("completions", "m", CompletionRequest(prompt="x"), PLAN, "cmpl-1", True)
    stalled = GatewayError(ErrorKind.STREAM_STALLED, "no progress")
    span.finish(finished("error", stalled, done=False))
    (done,) = exporter.get_finished_spans()
    assert done.name == "text_completion m"
    assert done.status.status_code == StatusCode.ERROR
    attrs = dict(done.attributes or {})
    assert attrs["error.type"] == "stream_stalled"
    assert attrs["gen_ai.response.finish_reasons"] == ("error",)
    assert attrs["gen_ai.request.stream"] is True
    assert "gen_ai.usage.output_tokens" not in attrs


def test_a_client_that_left_and_a_cancelled_call_end_their_spans() -> None:
    spans, exporter, _ = in_memory()
    left = spans.start("chat", "m", chat_request(), PLAN, "chatcmpl-1", True)
    left.finish(finished("disconnected", done=False))
    cancelled = spans.start("chat", "m", chat_request(), PLAN, "chatcmpl-2", False)
    cancelled.interrupted(TimeoutError())
    cancelled.finish(finished("complete"))  # already ended: no-op
    first, second = exporter.get_finished_spans()
    assert dict(first.attributes or {})["error.type"] == "client_disconnected"
    assert dict(second.attributes or {})["error.type"] == "TimeoutError"
    assert second.status.status_code == StatusCode.ERROR
    assert "gen_ai.usage.input_tokens" not in dict(second.attributes or {})


def test_only_parameters_the_client_set_are_reported() -> None:
    assert request_attributes(chat_request()) == {}
    attrs = request_attributes(chat_request(max_tokens=5, frequency_penalty=0.5, seed=1))
    assert attrs == {
        "gen_ai.request.max_tokens": 5,
        "gen_ai.request.frequency_penalty": 0.5,
        "gen_ai.request.seed": 1,
    }


def test_stop_sequences_output_type_and_a_streams_time_to_first_chunk() -> None:
    """Recommended and Conditionally Required attributes of the GenAI conventions: the
    request's stop strings, the output type its format asks for, and for a stream the
    seconds from its arrival to its first chunk (`Finished.ttft_s`)."""
    spans, exporter, _ = in_memory()
    asked = chat_request(stop=["\n\n", "END"], response_format={"type": "json_object"})
    streamed = spans.start("chat", "m", asked, PLAN, "chatcmpl-1", True)
    streamed.finish(Finished("chat", PLAN, "complete", None, outcome(), 0.3, 0.042, True))
    plain = spans.start("chat", "m", chat_request(stop="END"), PLAN, "chatcmpl-2", False)
    plain.finish(finished("complete"))
    first, second = (dict(s.attributes or {}) for s in exporter.get_finished_spans())
    assert first["gen_ai.request.stop_sequences"] == ("\n\n", "END")
    assert first["gen_ai.output.type"] == "json"
    assert first["gen_ai.response.time_to_first_chunk"] == 0.042
    assert second["gen_ai.request.stop_sequences"] == ("END",)
    assert "gen_ai.output.type" not in second  # no format asked: not reported
    assert "gen_ai.response.time_to_first_chunk" not in second  # not a stream


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        ({"response_format": {"type": "text"}}, "text"),
        ({"response_format": {"type": "json_object"}}, "json"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}}, "json"),
        ({}, None),
    ],
)
def test_the_output_type_of_each_openai_format(body: dict[str, object], kind: str | None) -> None:
    assert output_type(chat_request(**body)) == kind
    assert output_type(CompletionRequest(prompt="x", **body)) == kind


def test_the_output_type_of_a_responses_text_format() -> None:
    schema = {"type": "json_schema", "name": "n", "schema": {"type": "object"}}
    asked = ResponsesRequest.model_validate({"input": "x", "text": {"format": schema}})
    assert output_type(asked) == "json"
    assert output_type(ResponsesRequest.model_validate({"input": "x"})) is None


def test_without_a_tracer_spans_are_free_no_ops() -> None:
    span = InferenceSpans().start("chat", "m", chat_request(), PLAN, "chatcmpl-1", False)
    with span.current():
        SpanEvents().on_drift(DriftEvent("c", "l", 1, 1.0, 2.0, (), (), 3))
    span.finish(finished("complete"))
    assert not span.span.is_recording()


def tiny_app() -> FastAPI:
    app = FastAPI()

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


async def test_a_streamed_reply_is_one_server_span_not_one_per_chunk() -> None:
    exporter = InMemorySpanExporter()
    app = tiny_app()
    provider = setup_tracing(Settings(), app, exporter=exporter)
    assert provider is not None
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        r = await client.post("/v1/completions", json={})
        assert r.text.count("data: ") == STREAM_CHUNKS + 1
        assert (await client.get("/metrics")).status_code == 200  # not traced
    provider.force_flush()
    spans = exporter.get_finished_spans()
    # Without exclude_spans the ASGI instrumentation adds an internal span per `send`
    # (STREAM_CHUNKS + 2 of them here: the start, every chunk, the end).
    assert [(s.name, s.kind.name) for s in spans] == [("POST /v1/completions", "SERVER")]
    provider.shutdown()


def test_tracing_is_off_without_an_endpoint(monkeypatch: object) -> None:
    assert setup_tracing(Settings(), tiny_app()) is None


def test_the_gateway_setting_is_the_fallback_endpoint() -> None:
    with running() as receiver:
        app = tiny_app()
        provider = setup_tracing(Settings(receiver.endpoint), app)
        assert provider is not None
        with provider.get_tracer("t").start_as_current_span("probe"):
            pass
        provider.shutdown()
        (span,) = receiver.wait_for(lambda got: len(got) == 1)
    assert span.name == "probe"
    assert span.resource["service.name"] == "spec-gateway"
