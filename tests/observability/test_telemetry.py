"""`GatewayTelemetry`, what the real service calls at each request's end: it counts the
request and folds the outcome into the metrics. It leaves the current (HTTP) span alone:
the GenAI attributes belong to the request's inference span (`test_tracing.py`)."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from gateway.control.plane import Plan
from gateway.errors import ErrorKind, GatewayError
from gateway.observability.metrics import GatewayMetrics
from gateway.replies import Finished
from gateway.telemetry import GatewayTelemetry
from tests.observability.conftest import sample_outcome

LABEL = "chat/len:512"
CLASS_ID = "0123456789abcdef"


def finish(telemetry: GatewayTelemetry, **fields: object) -> dict[str, object]:
    """End one request inside a recording span; return the span's attributes."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    plan = fields.pop("plan", None) or Plan(CLASS_ID, LABEL, 3, "goodput")
    defaults: dict[str, object] = {"status": "complete", "error": None, "outcome": None}
    with provider.get_tracer("test").start_as_current_span("POST /v1/chat/completions"):
        telemetry.request_finished(
            Finished("chat", plan, e2e_s=0.5, ttft_s=0.08, stream=True, **(defaults | fields))  # type: ignore[arg-type]
        )
    (span,) = exporter.get_finished_spans()
    return dict(span.attributes or {})


def test_a_finished_request_reaches_the_metrics_not_the_http_span() -> None:
    metrics = GatewayMetrics(CollectorRegistry(), max_depth=4)
    outcome = sample_outcome(3, 10, (8, 5, 2))
    attrs = finish(GatewayTelemetry(metrics, "specgw-default"), outcome=outcome)
    assert attrs == {}  # the HTTP span carries no GenAI attributes
    value = metrics.registry.get_sample_value
    assert value(
        "specgw_requests_total", {"class_id": CLASS_ID, "status": "200", "error_type": "none"}
    )
    assert value("specgw_verify_steps_total", {"class_id": CLASS_ID}) == 10
    assert value("specgw_speculation_depth", {"class_id": CLASS_ID}) == 3
    assert value("specgw_batch_lowered_requests_total", {"class_id": CLASS_ID}) == 0
    assert value("specgw_class_info", {"class_id": CLASS_ID, "label": LABEL}) == 1
    lowered = Plan(CLASS_ID, LABEL, 0, "goodput; lowers the batch", cap=0)
    finish(GatewayTelemetry(metrics, "specgw-default"), plan=lowered)
    assert value("specgw_batch_lowered_requests_total", {"class_id": CLASS_ID}) == 1


def test_an_error_is_counted_with_its_status_and_type() -> None:
    metrics = GatewayMetrics(CollectorRegistry(), max_depth=4)
    error = GatewayError(ErrorKind.STREAM_STALLED, "no progress")
    assert finish(GatewayTelemetry(metrics, "m"), status="error", error=error) == {}
    labels = {
        "class_id": CLASS_ID,
        "status": str(error.status),
        "error_type": error.kind.openai_type,
    }
    assert metrics.registry.get_sample_value("specgw_requests_total", labels) == 1
