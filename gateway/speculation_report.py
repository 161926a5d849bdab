"""One speculation report per response: vLLM's `metrics.speculative_decoding` block as
vLLM defines it, and beside it the gateway's `speculation` object with what only the
gateway knows.

vLLM's block (`engine.spec_decode_report`; experimental in vLLM, read by AIPerf and
llama-swap) holds the counts: acceptance histogram, steps, drafted and accepted tokens,
mean acceptance length, and at vLLM's `detailed` level the per-step lists. The
`speculation` object holds the decision: the request's class (`class`, `class_id`), its
depth `k` and the controller's `reason`; it repeats none of vLLM's counts.

How much is written is a level with vLLM's names (`--per-request-spec-decode-metrics`):
`none` (no report: vLLM's block is removed too), `summary` (the block without its
per-step lists, as vLLM writes it at `summary`), `detailed` (the lists too). The server
sets it (`speculation_report`); vLLM has no request field for it, so a request may lower
it with the body field `speculation_report` (`extra_body` in OpenAI's clients), never
raise it past the server's. The engine runs at `detailed` whatever the report says: the
controller needs the per-step lists (`engine.per_request_metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, cast

from engine.interface import RequestOutcome
from engine.spec_decode_report import PER_STEP_KEYS, speculative_decoding
from gateway.control.plane import Plan
from gateway.errors import ErrorKind, GatewayError

ReportLevel = Literal["none", "summary", "detailed"]
#: The body field a request lowers the report with.
REQUEST_FIELD = "speculation_report"
_RANK: dict[str, int] = {"none": 0, "summary": 1, "detailed": 2}


def requested_level(request: Any, server: ReportLevel) -> ReportLevel:
    """The level of one request's report: the server's, or lower where it asks."""
    extra = getattr(request, "model_extra", None) or {}
    if REQUEST_FIELD not in extra:
        return server
    asked = extra[REQUEST_FIELD]
    if not isinstance(asked, str) or asked not in _RANK:
        raise GatewayError(
            ErrorKind.INVALID_REQUEST,
            f"`{REQUEST_FIELD}` must be one of none, summary, detailed; got {asked!r}.",
            param=REQUEST_FIELD,
        )
    return server if _RANK[asked] >= _RANK[server] else cast(ReportLevel, asked)


@dataclass(frozen=True, slots=True)
class SpeculationReport:
    """Writes one answer's report (a reply body, a stream's usage chunk, a Responses
    answer) at `level`, for the request planned by `plan`."""

    level: ReportLevel
    plan: Plan

    def decision(self) -> dict[str, Any]:
        plan = self.plan
        return {"class": plan.label, "class_id": plan.class_id, "k": plan.k, "reason": plan.reason}

    def write(self, body: dict[str, Any], outcome: RequestOutcome | None) -> dict[str, Any]:
        """`body` (a JSON object, edited in place and returned) with the report: vLLM's
        block kept, or written from the engine's counts where its serving wrote none
        (vLLM's Responses API), its per-step lists cut below `detailed`; the gateway's
        `speculation` object beside it."""
        metrics = body.get("metrics")
        metrics = dict(metrics) if isinstance(metrics, dict) else {}
        block = metrics.pop("speculative_decoding", None)
        if self.level != "none":
            if block is None and outcome is not None:
                block = speculative_decoding(outcome.speculation)
            if block is not None:
                if self.level != "detailed":
                    block = {key: v for key, v in block.items() if key not in PER_STEP_KEYS}
                metrics["speculative_decoding"] = block
        if metrics:
            body["metrics"] = metrics
        else:
            body.pop("metrics", None)
        if self.level != "none":
            body["speculation"] = self.decision()
        return body
