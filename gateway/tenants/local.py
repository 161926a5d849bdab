"""This replica's own buckets: what it enforces when Redis does not decide.

Each limit becomes this replica's share, `max(1, limit // replicas)`, so that
the replicas together stay within the cluster-wide limit while they cannot
coordinate (rounded down; at least 1, or a key could never be served).

While Redis decides, the same buckets are charged with what Redis allowed
through this replica (`shadow`): when Redis goes away, a replica's buckets
already hold its recent traffic, instead of starting full and letting a key
spend a fresh share on every replica at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.tenants import gcra
from gateway.tenants.decision import Decision
from gateway.tenants.directory import Tenant


@dataclass(slots=True)
class _Buckets:
    requests_tat: float | None = None
    tokens_tat: float | None = None
    in_flight: int = 0


def monotonic_ms() -> float:
    return time.monotonic() * 1000.0


class LocalShare:
    """Per-key GCRA buckets and in-flight counts of one replica, at its share of each limit.

    The state is one small record per key digest; only authorized keys reach it,
    so it is bounded by the configured keys.
    """

    def __init__(self, replicas: int, clock: Callable[[], float] = monotonic_ms) -> None:
        self.replicas = replicas
        self._clock = clock
        self._keys: dict[str, _Buckets] = {}

    def share(self, limit: int) -> int:
        return max(1, limit // self.replicas) if limit > 0 else 0

    def in_flight(self, key: str) -> int:
        buckets = self._keys.get(key)
        return buckets.in_flight if buckets is not None else 0

    def _buckets(self, key: str) -> _Buckets:
        buckets = self._keys.get(key)
        if buckets is None:
            buckets = self._keys[key] = _Buckets()
        return buckets

    def check(self, tenant: Tenant, tokens: int) -> Decision:
        """Decide at this replica's share; an allowed request is charged and counted."""
        policy, b, now = tenant.policy, self._buckets(tenant.key), self._clock()
        rpm, tpm = self.share(policy.requests_per_minute), self.share(policy.tokens_per_minute)
        conc = self.share(policy.max_concurrent)
        req = gcra.check(b.requests_tat, now, rpm, 1) if rpm else None
        tok = gcra.check(b.tokens_tat, now, tpm, tokens) if tpm else None
        if req is not None and not req.allowed:
            return Decision("requests", req, _as_is(tok, b.tokens_tat, now), conc, req.retry_ms)
        if tok is not None and not tok.allowed:
            return Decision("tokens", _as_is(req, b.requests_tat, now), tok, conc, tok.retry_ms)
        if conc and b.in_flight >= conc:
            req, tok = _as_is(req, b.requests_tat, now), _as_is(tok, b.tokens_tat, now)
            return Decision("concurrency", req, tok, conc, 1000.0)
        if req is not None:
            b.requests_tat = req.tat_ms
        if tok is not None:
            b.tokens_tat = tok.tat_ms
        b.in_flight += 1
        return Decision("allowed", req, tok, conc)

    def shadow(self, tenant: Tenant, tokens: int) -> None:
        """Charge a request the cluster allowed through this replica (no check)."""
        policy, b, now = tenant.policy, self._buckets(tenant.key), self._clock()
        b.in_flight += 1
        b.requests_tat = _charge(b.requests_tat, now, self.share(policy.requests_per_minute), 1)
        b.tokens_tat = _charge(b.tokens_tat, now, self.share(policy.tokens_per_minute), tokens)

    def settle(self, tenant: Tenant, token_delta: int) -> None:
        """A request of this replica ended: it leaves the in-flight count, and the
        difference between its used and reserved tokens is charged (or refunded)."""
        b = self._buckets(tenant.key)
        b.in_flight = max(0, b.in_flight - 1)
        if token_delta:
            tpm = self.share(tenant.policy.tokens_per_minute)
            b.tokens_tat = _charge(b.tokens_tat, self._clock(), tpm, token_delta)


def _charge(tat: float | None, now: float, limit: int, cost: int) -> float | None:
    return gcra.charge(tat, now, limit, cost) if limit else tat


def _as_is(verdict: gcra.Verdict | None, tat: float | None, now: float) -> gcra.Verdict | None:
    """A bucket's state without this request: what a refusal's headers report."""
    if verdict is None:
        return None
    return gcra.check(tat, now, verdict.limit, 0)
