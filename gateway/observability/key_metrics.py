"""Per-key families of the `specgw_*` catalogue: limits, tokens, fair shares, the limiter.

The `key` label is the key's label from the config (`tenants.keys`), `other` for a
valid key without one, `anonymous` without API keys: never a key or its digest,
and bounded by the config. Families live on the replica's one registry, beside
`GatewayMetrics`.

* refusal ratio of a key::

      sum by (key) (rate(specgw_key_requests_total{result!="allowed"}[5m]))
        / (sum by (key) (rate(specgw_key_requests_total[5m])) > 0)

* tokens per minute a key used (prompt + completion, settled from usage)::

      sum by (key) (rate(specgw_key_tokens_total[5m])) * 60

* replicas deciding limits locally because Redis is away::

      count(specgw_ratelimit_mode{mode="local-share"} == 1)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge

RESULTS = ("allowed", "requests", "tokens", "concurrency")
LIMIT_MODES = ("off", "cluster", "local-share", "local")


class KeyMetrics:
    """Implements `gateway.tenants.LimitEvents`; `labels` are every possible key label."""

    def __init__(self, registry: CollectorRegistry, labels: Iterable[str]) -> None:
        self.labels = tuple(dict.fromkeys(labels))
        r = registry
        self.checks = Counter(
            "specgw_key_requests",
            "Requests checked against their key's limits, by key label and result "
            "(allowed, or the limit that refused it: requests, tokens, concurrency).",
            ["key", "result"],
            registry=r,
        )
        self.tokens = Counter(
            "specgw_key_tokens",
            "Prompt + completion tokens charged to a key (settled from usage; the "
            "reservation where usage is unknown), by key label.",
            ["key"],
            registry=r,
        )
        self.running = Gauge(
            "specgw_key_running_requests", "Admitted requests running, by key label.", ["key"],
            registry=r,
        )  # fmt: skip
        self.queued = Gauge(
            "specgw_key_queued_requests", "Requests waiting for admission, by key label.", ["key"],
            registry=r,
        )  # fmt: skip
        self.mode = Gauge(
            "specgw_ratelimit_mode",
            "Where per-key limits are decided: 1 for the current mode (cluster: Redis; "
            "local-share: Redis unreachable, limit // replicas here; local: no Redis; off).",
            ["mode"],
            registry=r,
        )
        self.fallbacks = Counter(
            "specgw_ratelimit_fallbacks",
            "Times a limit check or settlement found Redis slow or down and fell back to the "
            "replica's local share.",
            registry=r,
        )
        self._checks = {
            (k, res): self.checks.labels(k, res) for k in self.labels for res in RESULTS
        }
        self._tokens = {k: self.tokens.labels(k) for k in self.labels}
        for key in self.labels:
            self.running.labels(key)
            self.queued.labels(key)
        self.set_mode("off")

    # ---- LimitEvents ------------------------------------------------------------------
    def limit_checked(self, label: str, status: str) -> None:
        child = self._checks.get((label, status))
        if child is not None:
            child.inc()

    def tokens_settled(self, label: str, tokens: int) -> None:
        child = self._tokens.get(label)
        if child is not None and tokens > 0:
            child.inc(tokens)

    def limit_fallback(self) -> None:
        self.fallbacks.inc()

    # ---- at scrape time ---------------------------------------------------------------
    def set_mode(self, mode: str) -> None:
        for m in LIMIT_MODES:
            self.mode.labels(m).set(1 if m == mode else 0)

    def set_load(self, by_label: Mapping[str, tuple[int, int]]) -> None:
        """Label -> (running, queued); labels not given are at 0."""
        for key in self.labels:
            running, queued = by_label.get(key, (0, 0))
            self.running.labels(key).set(running)
            self.queued.labels(key).set(queued)
