"""OpenTelemetry tracing: one server span per request, with GenAI attributes.

The server span comes from `opentelemetry-instrumentation-fastapi` (no hand-written
middleware). The gateway annotates it, once the engine outcome is known, with the
GenAI semantic-convention attributes (`gen_ai.*`, OpenTelemetry semconv 1.3x) and
the gateway's own (`specgw.class`, `specgw.k`, `specgw.acceptance_length`).
Prompt and completion text never go into a span: only counts and ids.

Tracing is off unless an OTLP/HTTP endpoint is configured. The provider is not
installed as the process-global one: it is handed to the instrumentation, so two
apps in one process (tests) keep separate traces.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span

#: Probes and scrapes are not traced: they would drown the request spans.
EXCLUDED_URLS = "/health,/ready,/metrics"
SERVICE_NAME = "spec-gateway"

# GenAI semantic conventions (https://opentelemetry.io/docs/specs/semconv/gen-ai/).
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
SPECGW_CLASS = "specgw.class"
SPECGW_CLASS_ID = "specgw.class_id"
SPECGW_K = "specgw.k"
SPECGW_ACCEPTANCE_LENGTH = "specgw.acceptance_length"
SPECGW_VERIFY_STEPS = "specgw.verify_steps"


class TracingConfig(Protocol):
    """What tracing reads from the gateway settings (`GatewaySettings` has it)."""

    @property
    def otel_endpoint(self) -> str | None: ...


def setup_tracing(
    settings: TracingConfig,
    app: FastAPI,
    exporter: SpanExporter | None = None,
) -> TracerProvider | None:
    """Instrument `app` when `settings.otel_endpoint` is set (or an exporter is given,
    as tests do); return the provider so the caller shuts it down (flushes), or None
    when tracing is off."""
    if exporter is None:
        if not settings.otel_endpoint:
            return None
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter(endpoint=settings.otel_endpoint)
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE_NAME}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    FastAPIInstrumentor.instrument_app(
        app,
        tracer_provider=provider,
        excluded_urls=EXCLUDED_URLS,
        # The ASGI instrumentation otherwise opens an internal span per `send` event:
        # one per SSE chunk, so a streamed reply of 500 tokens made 500 spans (and as
        # many exporter records) under its one server span.
        exclude_spans=["receive", "send"],
    )
    return provider


@dataclass(frozen=True, slots=True)
class GenAIAttributes:
    """What the gateway knows about one request; no prompt or completion text."""

    operation: str  # "chat" or "text_completion"
    model: str
    cls: str
    k: int
    class_id: str = ""
    response_id: str = ""
    max_tokens: int | None = None
    temperature: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    finish_reasons: Sequence[str] = ()
    acceptance_length: float | None = None
    verify_steps: int | None = None

    def as_dict(self) -> dict[str, str | int | float | list[str]]:
        out: dict[str, str | int | float | list[str]] = {
            GEN_AI_OPERATION: self.operation,
            GEN_AI_PROVIDER: "vllm",
            GEN_AI_REQUEST_MODEL: self.model,
            GEN_AI_RESPONSE_MODEL: self.model,
            SPECGW_CLASS: self.cls,
            SPECGW_K: self.k,
        }
        optional: dict[str, str | int | float | list[str] | None] = {
            SPECGW_CLASS_ID: self.class_id or None,
            GEN_AI_RESPONSE_ID: self.response_id or None,
            GEN_AI_REQUEST_MAX_TOKENS: self.max_tokens,
            GEN_AI_REQUEST_TEMPERATURE: self.temperature,
            GEN_AI_INPUT_TOKENS: self.input_tokens,
            GEN_AI_OUTPUT_TOKENS: self.output_tokens,
            GEN_AI_RESPONSE_FINISH_REASONS: list(self.finish_reasons) or None,
            SPECGW_ACCEPTANCE_LENGTH: self.acceptance_length,
            SPECGW_VERIFY_STEPS: self.verify_steps,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out


def annotate_span(attributes: GenAIAttributes, span: Span | None = None) -> None:
    """Set the GenAI attributes on `span` (default: the current request span).

    A no-op when tracing is off: the current span is then the non-recording one.
    """
    target = span if span is not None else trace.get_current_span()
    if target.is_recording():
        target.set_attributes(attributes.as_dict())


def add_span_event(
    name: str, attributes: dict[str, str | int | float], span: Span | None = None
) -> None:
    """Attach an event (drift, decision change) to the current request span."""
    target = span if span is not None else trace.get_current_span()
    if target.is_recording():
        target.add_event(name, attributes)
