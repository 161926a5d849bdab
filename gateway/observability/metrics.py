"""The one catalogue of `specgw_*` Prometheus families, and the `/metrics` rendering.

Every family the gateway exports is declared here, on an injected
`CollectorRegistry` (no module globals, so tests and replicas build their own).
Conventions (DESIGN.md): prefix `specgw_`, base units (`_seconds`), `_total` only
on counters (prometheus-client appends it), draft `position` 0-indexed as vLLM labels it.

Class identity: per-class series carry `class_id`, the class's stable id
(`RequestClass.class_id`: 16 hex digits, `other` for the fold-in class, `unclassified`
for requests refused before classification), never its human label, which two classes
can share. One `specgw_class_info{class_id, label} 1` per class that has series carries
the label (the kube-state-metrics `_info` convention); join it where a human reads::

    sum by (class_id) (rate(specgw_output_tokens_total[5m]))
      * on (class_id) group_left (label) specgw_class_info

(over several replicas, join a `topk by (class_id) (1, specgw_class_info)`: one info
series per id). Evicting a class removes exactly its series, its info series included.

Cost: the controller folds classes beyond `max_classes` into `other`, so at most
`max_classes + 1` ids (+ `unclassified`). A class that served one request has
`class_series(K)` = 115 + 2 K series (K = 4: 123): six histograms (4 x 17 + 2 x 18
buckets, sums and counts), seven counters, 2 K per-position counters, three gauges and
its info series; plus one `specgw_requests_total` per (status, error type) it met, one
`specgw_controller_decisions_total` per (old k, new k, reason) and at most two
`specgw_drift_events_total`. At the default cap of 64 with K = 4 and one status each,
a replica exports 65 x 124 = 8060 per-class series beside its own few dozen
(`tests/observability/test_series_count.py` counts them from the exposition).
prometheus-client's `_created` series are off (`GatewayMetrics`), vLLM's included: they
would add 22 more per class.

Derived figures, as the recording rules in `deploy/prometheus/rules.yml` compute them
(`sum by (class_id)` implied):

* acceptance length (vLLM's definition, bonus token included)::

      1 + rate(specgw_accepted_tokens_total[5m]) / (rate(specgw_verify_steps_total[5m]) > 0)

  It reconciles with the engine-wide
  `1 + rate(vllm:spec_decode_num_accepted_tokens_total) / rate(vllm:spec_decode_num_drafts_total)`
  when summed over classes (vLLM counts a "draft" per request per verify step).
* acceptance rate at draft position p::

      rate(specgw_accepted_tokens_per_position_total{position="p"}[5m])
        / (rate(specgw_draft_tokens_per_position_total{position="p"}[5m]) > 0)

* fallback (k = 0) share::

      rate(specgw_fallback_requests_total[5m]) / (rate(specgw_acceptance_length_count[5m]) > 0)

  (both count finished requests with an engine outcome).
* output tokens/s: `rate(specgw_output_tokens_total[5m])`; TPOT p50::

      histogram_quantile(0.5,
        sum by (class_id, le) (rate(specgw_time_per_output_token_seconds_bucket[5m])))

* time to first token as the client waits for it, and the part the gateway adds::

      histogram_quantile(0.95,
        sum by (class_id, le) (rate(specgw_gateway_time_to_first_token_seconds_bucket[5m])))
      rate(specgw_admission_wait_seconds_sum[5m])
        / (rate(specgw_admission_wait_seconds_count[5m]) > 0)

  (`specgw_time_to_first_token_seconds` starts at the engine, as vLLM's does).
* error ratio::

      rate(specgw_requests_total{status=~"5.."}[5m]) / (rate(specgw_requests_total[5m]) > 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    disable_created_metrics,
    generate_latest,
)

from engine.interface import RequestOutcome
from gateway.observability.replica_metrics import ReplicaMetrics

#: Request latency (TTFT, end-to-end), seconds: 5 ms to 2 min.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
)  # fmt: skip
#: Time per output token, seconds: 1 ms to 2 s (a CPU step is ~5-50 ms).
TOKEN_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.0,
)  # fmt: skip
#: Per-request acceptance length: 1 (nothing accepted) to K + 1 (all of K = 8 accepted).
ACCEPTANCE_LENGTH_BUCKETS: tuple[float, ...] = (
    1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0,
)  # fmt: skip

#: `error_type` of a request that succeeded.
NO_ERROR = "none"
#: The per-class label: the class's id, never its human label (two classes can share one).
CLASS_ID = "class_id"


class NamedClass(Protocol):
    """A request class as the catalogue names it, by id and label: `RequestClass`, a
    `Plan`, the controller's events and its reports all are one."""

    @property
    def class_id(self) -> str: ...

    @property
    def label(self) -> str: ...


def class_series(max_depth: int) -> int:
    """Series of a class that served one request, before the ones counted by status,
    decision and drift (the module docstring lists them)."""
    histograms = 4 * (len(LATENCY_BUCKETS_S) + 3) + (len(TOKEN_LATENCY_BUCKETS_S) + 3)
    histograms += len(ACCEPTANCE_LENGTH_BUCKETS) + 3  # buckets, +Inf, sum, count
    # prompt, output, draft and accepted tokens, verify steps, fallbacks, batch lowered;
    # speculation depth, drift score, measured positions.
    counters, gauges, info = 7, 3, 1
    return histograms + counters + 2 * max_depth + gauges + info


@dataclass(frozen=True, slots=True)
class _ClassChildren:
    """The children of one class, bound once (label lookup is off the hot path)."""

    ttft: Histogram
    gateway_ttft: Histogram
    admission_wait: Histogram
    tpot: Histogram
    e2e: Histogram
    acceptance_length: Histogram
    prompt_tokens: Counter
    output_tokens: Counter
    draft_tokens: Counter
    accepted_tokens: Counter
    verify_steps: Counter
    fallback: Counter
    #: Bound with the class, so the series exists (at 0) before the first event: the
    #: dashboard's rate panel then draws "none lowered" instead of "no data".
    batch_lowered: Counter
    drafted_per_position: tuple[Counter, ...]
    accepted_per_position: tuple[Counter, ...]


class GatewayMetrics(ReplicaMetrics):
    """All `specgw_*` families on one registry, with typed `record_*` helpers: the
    per-class request families here, the replica's state in `ReplicaMetrics`.

    `max_depth` (K) bounds the `position` label; `flags` names the flags exported as
    `specgw_flag_state{flag}` (numeric value: 1/0 for booleans, the number otherwise).
    Every `record_*` takes the class as a `NamedClass` and keeps its info series.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        max_depth: int,
        flags: Sequence[str] = (),
    ) -> None:
        # prometheus-client's `_created` switch is process-wide and read at each scrape, so
        # turning it off where the catalogue is built also drops it from vLLM's families
        # on the default REGISTRY: one series per counter and histogram child nobody reads.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.max_depth = max_depth
        self._classes: dict[str, _ClassChildren] = {}
        #: class id -> the label its info series carries (one info series per id).
        self._labels: dict[str, str] = {}
        self.class_info = Info(
            "specgw_class",
            "1 per request class with series: its id and human label (join on class_id).",
            [CLASS_ID],
            registry=registry,
        )
        self._declare_latencies(registry)
        self._declare_tokens(registry)
        self._declare_controller(registry)
        super().__init__(registry, flags=flags, max_depth=max_depth)

    def _declare_latencies(self, r: CollectorRegistry) -> None:
        """Requests by outcome and their latencies and acceptance length, by class."""
        self.requests = Counter(
            "specgw_requests",
            "Requests answered, by class, HTTP status code and OpenAI error type.",
            [CLASS_ID, "status", "error_type"],
            registry=r,
        )
        self.ttft = Histogram(
            "specgw_time_to_first_token_seconds",
            "Seconds from engine arrival to the first output token, by class.",
            [CLASS_ID],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.gateway_ttft = Histogram(
            "specgw_gateway_time_to_first_token_seconds",
            "Seconds from arrival at the gateway to the first output token (admission wait "
            "included), by class.",
            [CLASS_ID],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.admission_wait = Histogram(
            "specgw_admission_wait_seconds",
            "Seconds an admitted request waited for its admission slot, by class.",
            [CLASS_ID],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.tpot = Histogram(
            "specgw_time_per_output_token_seconds",
            "Mean seconds per output token after the first, per request, by class.",
            [CLASS_ID],
            buckets=TOKEN_LATENCY_BUCKETS_S,
            registry=r,
        )
        self.e2e = Histogram(
            "specgw_request_duration_seconds",
            "Seconds from engine arrival to the last token, by class.",
            [CLASS_ID],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.acceptance_length = Histogram(
            "specgw_acceptance_length",
            "Per-request acceptance length (1 + accepted / verify steps, vLLM's definition).",
            [CLASS_ID],
            buckets=ACCEPTANCE_LENGTH_BUCKETS,
            registry=r,
        )

    def _declare_tokens(self, r: CollectorRegistry) -> None:
        """Token counts of finished requests, per class and per draft position."""
        self.prompt_tokens = _counter(r, "prompt_tokens", "Prompt tokens of finished requests.")
        self.output_tokens = _counter(r, "output_tokens", "Output tokens of finished requests.")
        self.draft_tokens = _counter(r, "draft_tokens", "Draft tokens proposed to the target.")
        self.accepted_tokens = _counter(r, "accepted_tokens", "Draft tokens the target accepted.")
        self.verify_steps = _counter(
            r, "verify_steps", "Engine steps that verified at least one draft token."
        )
        self.fallback_requests = _counter(
            r, "fallback_requests", "Finished requests that ran with k = 0 (no drafts)."
        )
        self.batch_lowered = _counter(
            r,
            "batch_lowered_requests",
            "Requests that lowered the deeper requests in flight (their class's batch floor, "
            "or the batch's own tokens per step cost: batch-lower).",
        )
        self.drafted_per_position = Counter(
            "specgw_draft_tokens_per_position",
            "Draft tokens proposed at each draft position (0-indexed), by class.",
            [CLASS_ID, "position"],
            registry=r,
        )
        self.accepted_per_position = Counter(
            "specgw_accepted_tokens_per_position",
            "Draft tokens accepted at each draft position (0-indexed), by class.",
            [CLASS_ID, "position"],
            registry=r,
        )

    def _declare_controller(self, r: CollectorRegistry) -> None:
        """The controller's depth, decisions and drift, by class."""
        self.speculation_depth = Gauge(
            "specgw_speculation_depth",
            "Speculation depth k most recently given to a request of the class.",
            [CLASS_ID],
            registry=r,
        )
        self.decisions = Counter(
            "specgw_controller_decisions",
            "Changes of a class's adaptive k, by class, old k, new k and reason.",
            [CLASS_ID, "from_k", "to_k", "reason"],
            registry=r,
        )
        self.drift_score = Gauge(
            "specgw_drift_score",
            "Page-Hinkley statistic of the class's acceptance (0 = no evidence of change).",
            [CLASS_ID],
            registry=r,
        )
        self.measured_positions = Gauge(
            "specgw_class_measured_positions",
            "Draft positions of the class's depth profile its own verify steps tried, from "
            "position 1 (0 = its acceptance is the prior's or a similar class's, unmeasured).",
            [CLASS_ID],
            registry=r,
        )
        self.drift_events = Counter(
            "specgw_drift_events",
            "Change points detected in a class's acceptance, by direction (up/down).",
            [CLASS_ID, "direction"],
            registry=r,
        )

    # ---- per class --------------------------------------------------------------------
    def _named(self, cls: NamedClass) -> str:
        """The class's id, with its info series set on first sight (every record path
        comes here, so no class has series without one)."""
        cid = cls.class_id
        if cid not in self._labels:
            self._labels[cid] = cls.label
            self.class_info.labels(cid).info({"label": cls.label})
        return cid

    def _children(self, cls: NamedClass) -> _ClassChildren:
        cid = self._named(cls)
        children = self._classes.get(cid)
        if children is None:
            positions = range(self.max_depth)
            children = _ClassChildren(
                ttft=self.ttft.labels(cid),
                gateway_ttft=self.gateway_ttft.labels(cid),
                admission_wait=self.admission_wait.labels(cid),
                tpot=self.tpot.labels(cid),
                e2e=self.e2e.labels(cid),
                acceptance_length=self.acceptance_length.labels(cid),
                prompt_tokens=self.prompt_tokens.labels(cid),
                output_tokens=self.output_tokens.labels(cid),
                draft_tokens=self.draft_tokens.labels(cid),
                accepted_tokens=self.accepted_tokens.labels(cid),
                verify_steps=self.verify_steps.labels(cid),
                fallback=self.fallback_requests.labels(cid),
                batch_lowered=self.batch_lowered.labels(cid),
                drafted_per_position=tuple(
                    self.drafted_per_position.labels(cid, str(p)) for p in positions
                ),
                accepted_per_position=tuple(
                    self.accepted_per_position.labels(cid, str(p)) for p in positions
                ),
            )
            self._classes[cid] = children
        return children

    def record_request(self, cls: NamedClass, status: int, error_type: str = NO_ERROR) -> None:
        """One answered request: `status` is the HTTP status (an in-stream error counts
        with the status it would have had), `error_type` the OpenAI `error.type`."""
        self.requests.labels(self._named(cls), str(status), error_type or NO_ERROR).inc()

    def record_admission(self, cls: NamedClass, wait_s: float) -> None:
        """An admitted request of `cls` and how long it waited for its slot."""
        self._children(cls).admission_wait.observe(wait_s)

    def record_gateway_ttft(self, cls: NamedClass, seconds: float) -> None:
        """Arrival at the gateway to the first output token (`Finished.gateway_ttft_s`)."""
        self._children(cls).gateway_ttft.observe(seconds)

    def record_depth(self, cls: NamedClass, k: int) -> None:
        """The k given to a request of `cls` (call once per request, after `decide`)."""
        self.speculation_depth.labels(self._named(cls)).set(k)

    def record_batch_lowered(self, cls: NamedClass) -> None:
        """A request of `cls` lowered the batch for its floor (`Plan.cap`)."""
        self._children(cls).batch_lowered.inc()

    def record_outcome(self, cls: NamedClass, outcome: RequestOutcome) -> None:
        """Fold one finished request's engine outcome in (latency, tokens, speculation).

        Per-position counts follow vLLM: position p counts steps that drafted (or
        accepted) draft token p + 1. Without `drafted_per_position` every verify step
        is taken to have drafted all k positions, as the controller assumes.
        """
        c = self._children(cls)
        spec = outcome.speculation
        c.ttft.observe(outcome.ttft_s)
        if outcome.output_tokens > 1:
            c.tpot.observe(outcome.tpot_s)
        c.e2e.observe(outcome.e2e_s)
        c.prompt_tokens.inc(outcome.prompt_tokens)
        c.output_tokens.inc(outcome.output_tokens)
        c.acceptance_length.observe(spec.acceptance_length)
        if spec.k == 0:
            c.fallback.inc()
        if spec.verify_steps <= 0:
            return
        c.verify_steps.inc(spec.verify_steps)
        c.draft_tokens.inc(spec.draft_tokens)
        c.accepted_tokens.inc(spec.accepted_tokens)
        depth = min(len(c.drafted_per_position), max(spec.k, len(spec.accepted_per_position)))
        for p in range(depth):
            if spec.drafted_per_position:
                drafted = _at(spec.drafted_per_position, p)
            else:
                drafted = spec.verify_steps if p < spec.k else 0
            c.drafted_per_position[p].inc(drafted)
            c.accepted_per_position[p].inc(_at(spec.accepted_per_position, p))

    def forget_class(self, class_id: str) -> None:
        """Drop every series of an evicted class, its info series included, so label
        cardinality stays bounded; other classes' series (a shared label or not) stay.

        Counters of a removed class restart from zero if it comes back; `rate()`
        treats that as a counter reset, which is what it is.
        """
        self._classes.pop(class_id, None)
        if self._labels.pop(class_id, None) is not None:
            self.class_info.remove(class_id)
        for family in (
            self.ttft, self.gateway_ttft, self.admission_wait, self.tpot, self.e2e,
            self.acceptance_length, self.prompt_tokens, self.output_tokens, self.draft_tokens,
            self.accepted_tokens, self.verify_steps, self.fallback_requests,
            self.speculation_depth, self.drift_score, self.measured_positions,
            self.batch_lowered, self.drafted_per_position, self.accepted_per_position,
            self.requests, self.decisions, self.drift_events,
        ):  # fmt: skip
            _remove_matching(family, class_id)

    # ---- controller events (see `events.MetricsEvents`) ------------------------------
    def record_decision_change(self, cls: NamedClass, old_k: int, new_k: int, reason: str) -> None:
        cid = self._named(cls)
        self.decisions.labels(cid, str(old_k), str(new_k), _reason_label(reason)).inc()

    def record_drift(self, cls: NamedClass, direction: int) -> None:
        self.drift_events.labels(self._named(cls), "up" if direction > 0 else "down").inc()

    def record_drift_score(self, cls: NamedClass, score: float) -> None:
        self.drift_score.labels(self._named(cls)).set(score)

    def record_measured_positions(self, cls: NamedClass, positions: int) -> None:
        self.measured_positions.labels(self._named(cls)).set(positions)


def render_metrics(registry: CollectorRegistry) -> tuple[bytes, str]:
    """The `/metrics` body: the gateway's families, then prometheus-client's default
    REGISTRY, where vLLM registers its `vllm:*` families (and process/python ones).
    Returns (body, content type) for the route."""
    body = generate_latest(registry)
    if registry is not REGISTRY:
        body += generate_latest(REGISTRY)
    return body, CONTENT_TYPE_LATEST


def _counter(registry: CollectorRegistry, name: str, help_text: str) -> Counter:
    return Counter(f"specgw_{name}", f"{help_text[:-1]}, by class.", [CLASS_ID], registry=registry)


def _at(values: tuple[int, ...], index: int) -> int:
    return values[index] if index < len(values) else 0


def _reason_label(reason: str) -> str:
    """Reasons like `explore k=3` or `goodput 1.8 > 1.5` would explode the label set;
    keep the leading word only (the controller's reasons start with their kind)."""
    head = reason.strip().split(" ", 1)[0] if reason.strip() else "unknown"
    return head[:32]


def _remove_matching(family: Counter | Gauge | Histogram, class_id: str) -> None:
    """Remove the family's children of one class (`class_id` is every family's first
    label; prometheus-client has no public way to list a family's children)."""
    for values in list(family._metrics):
        if values[0] == class_id:
            family.remove(*values)
