"""OpenTelemetry tracing: the HTTP server span, and the attribute names the gateway sets.

The server span comes from `opentelemetry-instrumentation-fastapi` (no hand-written
middleware); it also joins a caller's trace from its `traceparent` header. Under it,
`inference_span.InferenceSpans` opens the GenAI inference span of each request that
reaches the engine. Prompt and completion text never go into a span: only counts and ids.

Tracing is off unless an OTLP endpoint is configured (`otlp.trace_export_from_env`: the
standard `OTEL_*` variables, then `SPECGW_OTEL_ENDPOINT`). The provider is not installed
as the process-global one: it is handed to the instrumentation and to the service, so two
apps in one process (tests) keep separate traces, and vLLM, which installs its own global
provider when its `otlp_traces_endpoint` is set, does not take the gateway's spans over.
"""

from __future__ import annotations

import logging
from typing import Protocol

from fastapi import FastAPI
from opentelemetry import trace
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span
from opentelemetry.util.types import AttributeValue

from gateway.observability.otlp import resource_from_env, sampler_from_env, trace_export_from_env

log = logging.getLogger("specgw")

#: Probes and scrapes are not traced: they would drown the request spans.
EXCLUDED_URLS = "/health,/ready,/metrics"
#: The instrumentation scope of the gateway's own spans.
TRACER_NAME = "spec-gateway"

# GenAI semantic conventions, client inference span
# (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/).
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_PROVIDER = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_REQUEST_TOP_P = "gen_ai.request.top_p"
GEN_AI_REQUEST_TOP_K = "gen_ai.request.top_k"
GEN_AI_REQUEST_SEED = "gen_ai.request.seed"
GEN_AI_REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
GEN_AI_REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
GEN_AI_OUTPUT_TYPE = "gen_ai.output.type"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
ERROR_TYPE = "error.type"
# The gateway's own.
SPECGW_CLASS = "specgw.class"
SPECGW_CLASS_ID = "specgw.class_id"
SPECGW_K = "specgw.k"
SPECGW_REASON = "specgw.reason"
SPECGW_CAP = "specgw.cap"
SPECGW_ACCEPTANCE_LENGTH = "specgw.acceptance_length"
SPECGW_VERIFY_STEPS = "specgw.verify_steps"
SPECGW_DRAFT_TOKENS = "specgw.draft_tokens"
SPECGW_ACCEPTED_TOKENS = "specgw.accepted_tokens"


class TracingConfig(Protocol):
    """What tracing reads from the gateway settings (`GatewaySettings` has it)."""

    @property
    def otel_endpoint(self) -> str | None: ...


def setup_tracing(
    settings: TracingConfig,
    app: FastAPI,
    exporter: SpanExporter | None = None,
) -> TracerProvider | None:
    """Instrument `app` when an OTLP endpoint is configured (or an exporter is given, as
    tests do); return the provider so the caller hands its tracer to the service and
    shuts it down (flushes) at exit, or None when tracing is off.

    Raises ValueError for an `OTEL_*` value the gateway cannot honour (`otlp`).
    """
    if exporter is None:
        export = trace_export_from_env(settings.otel_endpoint)
        if export is None:
            return None
        exporter = export.exporter()
        destination = f"{export.endpoint} ({export.protocol}, from {export.source})"
    else:
        destination = type(exporter).__name__
    sampler_name, sampler = sampler_from_env()
    resource = resource_from_env()
    provider = TracerProvider(resource=resource, sampler=sampler)
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
    log.info(
        "tracing to %s as service %s, sampler %s",
        destination,
        resource.attributes[SERVICE_NAME],
        sampler_name,
    )
    return provider


def add_span_event(
    name: str, attributes: dict[str, AttributeValue], span: Span | None = None
) -> None:
    """Attach an event (drift, decision change) to `span`, by default the current one: the
    request's inference span while the service has it current, else its HTTP span."""
    target = span if span is not None else trace.get_current_span()
    if target.is_recording():
        target.add_event(name, attributes)
