"""Where a finished request goes besides the controller: metrics and a log line.

Its span is the service's (`gateway.observability.inference_span`); the log line carries
the request id and trace id (`gateway.observability.logs.RequestContextFilter`).

No prompt or completion text is recorded anywhere here (the README's logging
contract): only class, k, counts, timings and the error kind.
"""

from __future__ import annotations

import logging

from engine.interface import EngineStep
from gateway.control.classify import RequestClass
from gateway.errors import GatewayError
from gateway.observability.metrics import GatewayMetrics
from gateway.replies import Finished

log = logging.getLogger("specgw.requests")
#: The class of requests refused before they were classified (its id is its label).
UNCLASSIFIED = RequestClass("unclassified", "unclassified")


class GatewayTelemetry:
    def __init__(self, metrics: GatewayMetrics, model_name: str) -> None:
        self._metrics = metrics
        self._model = model_name

    def request_finished(self, finished: Finished) -> None:
        plan, outcome, error = finished.plan, finished.outcome, finished.error
        if error is not None:
            self._metrics.record_request(plan, error.status, error.kind.openai_type)
        elif finished.status == "complete":
            self._metrics.record_request(plan, 200)
        else:
            self._metrics.record_request(plan, 499, "client_disconnected")
        self._metrics.record_depth(plan, plan.k)
        if plan.cap is not None:
            self._metrics.record_batch_lowered(plan)
        if outcome is not None:
            self._metrics.record_outcome(plan, outcome)
        self._record_clock(finished)
        if not log.isEnabledFor(logging.INFO):
            return  # what `log.info` checks first, before the record's fields are built
        spec = outcome.speculation if outcome is not None else None
        log.info(
            "request finished",
            extra={
                "endpoint": finished.endpoint,
                "class": plan.label,
                "class_id": plan.class_id,
                "k": plan.k,
                "reason": plan.reason,
                "status": finished.status,
                "error": error.kind.label if error else None,
                "e2e_s": round(finished.e2e_s, 4),
                "acceptance_length": round(spec.acceptance_length, 3) if spec else None,
            },
        )

    def _record_clock(self, finished: Finished) -> None:
        """The admission wait, and the first token's latency from arrival at the gateway:
        (admitted - arrived) + the engine's TTFT (`gateway.request_clock`)."""
        plan, clock, outcome = finished.plan, finished.clock, finished.outcome
        if clock is None or clock.admission_wait_s is None or clock.before_engine_s is None:
            return
        self._metrics.record_admission(plan, clock.admission_wait_s)
        if outcome is not None and outcome.ttft_s > 0:
            self._metrics.record_gateway_ttft(plan, clock.before_engine_s + outcome.ttft_s)

    def engine_step(self, filed: bool, step: EngineStep) -> None:
        self._metrics.record_engine_step(
            filed, step.common_depth(), step.decode_requests > 0, step.graph_mode
        )

    def request_shed(self, endpoint: str, error: GatewayError) -> None:
        """A request refused at the edge, before it was parsed: it has no class yet."""
        self._unclassified("request shed", endpoint, error)

    def request_refused(self, endpoint: str, error: GatewayError) -> None:
        """A request refused after it arrived and before it was classified: its body or
        the model it names."""
        self._unclassified("request refused", endpoint, error)

    def _unclassified(self, what: str, endpoint: str, error: GatewayError) -> None:
        self._metrics.record_request(UNCLASSIFIED, error.status, error.kind.openai_type)
        log.info(
            what,
            extra={
                "endpoint": endpoint,
                "class": UNCLASSIFIED.label,
                "class_id": UNCLASSIFIED.class_id,
                "error": error.kind.label,
            },
        )
