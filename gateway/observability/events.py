"""Subscribers to the controller's `ControlEvents`: metrics and span events.

The controller fires events on changes only (never per request) and inside the
request that caused them (`Controller.observe` runs at the end of a request), so
the span subscriber attaches them to that request's span. Compose them with
`gateway.control.events.FanOutEvents(LoggingEvents(), MetricsEvents(m), SpanEvents())`.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.control.classify import RequestClass
from gateway.control.events import DecisionChange, DriftEvent
from gateway.control.report import ClassReport
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.tracing import SPECGW_CLASS, SPECGW_CLASS_ID, add_span_event

DECISION_EVENT = "specgw.decision_change"
DRIFT_EVENT = "specgw.drift"


class MetricsEvents:
    """Counts decisions and drifts per class; drops the series of evicted classes."""

    def __init__(self, metrics: GatewayMetrics) -> None:
        self._metrics = metrics

    def on_decision_change(self, change: DecisionChange) -> None:
        self._metrics.record_decision_change(change, change.old_k, change.new_k, change.reason)

    def on_drift(self, event: DriftEvent) -> None:
        self._metrics.record_drift(event, event.direction)

    def on_class_evicted(self, cls: RequestClass) -> None:
        self._metrics.forget_class(cls.class_id)


class SpanEvents:
    """Adds decision changes and drifts as events of the current request span."""

    def on_decision_change(self, change: DecisionChange) -> None:
        add_span_event(
            DECISION_EVENT,
            {
                SPECGW_CLASS: change.label,
                SPECGW_CLASS_ID: change.class_id,
                "specgw.bucket": change.bucket,
                "specgw.old_k": change.old_k,
                "specgw.new_k": change.new_k,
                "specgw.reason": change.reason,
            },
        )

    def on_drift(self, event: DriftEvent) -> None:
        add_span_event(
            DRIFT_EVENT,
            {
                SPECGW_CLASS: event.label,
                SPECGW_CLASS_ID: event.class_id,
                "specgw.direction": "up" if event.direction > 0 else "down",
                "specgw.length_before": event.length_before,
                "specgw.length_after": event.length_after,
                "specgw.samples": event.samples,
            },
        )

    def on_class_evicted(self, cls: RequestClass) -> None:
        return None


def export_class_reports(metrics: GatewayMetrics, reports: Iterable[ClassReport]) -> None:
    """Copy each live class's drift statistic into `specgw_drift_score` and the positions
    its verify steps measured (`ClassReport.measured_positions`) into
    `specgw_class_measured_positions` (call it from the periodic state flush, or before
    rendering `/metrics`, with `Controller.snapshot()`)."""
    for report in reports:
        metrics.record_drift_score(report, report.drift_statistic)
        metrics.record_measured_positions(report, report.measured_positions)
