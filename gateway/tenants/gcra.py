"""GCRA, the Generic Cell Rate Algorithm (ATM Forum Traffic Management 4.0, 1996).

A limit of L per period T is one "theoretical arrival time" (TAT) per bucket:
with emission interval I = T / L, a request of cost c at time `now` is allowed
iff

    max(TAT, now) + c * I - now <= T

and then TAT' = max(TAT, now) + c * I. This is a token bucket of capacity L
refilled at L / T, kept as one number: a full minute's burst, then one more
every I. From the same number come OpenAI's headers: remaining =
floor((T - (TAT' - now)) / I), reset (time until the bucket is full again) =
TAT' - now, and for a refused request retry-after = max(TAT, now) + c * I - T - now.
Redis-side, `scripts.CHECK` runs this very formula (redis-cell and the
`throttled` library use the same one).

Times are milliseconds. A cost above L can never fit: `retry_ms` is infinite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: Every limit here is per minute, as OpenAI states them (RPM, TPM).
PERIOD_MS = 60_000.0
#: Slack for float round-off in the comparisons (a thousandth of a millisecond).
_EPS = 1e-6


@dataclass(frozen=True, slots=True)
class Verdict:
    """One bucket's answer to one request."""

    allowed: bool
    limit: int
    #: Requests (or tokens) still available after this one, if it was allowed.
    remaining: int
    #: Milliseconds until the bucket is full again.
    reset_ms: float
    #: Milliseconds until this request would fit (0 when allowed, inf if never).
    retry_ms: float
    #: The bucket's TAT after this request (unchanged when refused).
    tat_ms: float

    @property
    def used(self) -> int:
        return self.limit - self.remaining


def check(
    tat_ms: float | None, now_ms: float, limit: int, cost: float, period_ms: float = PERIOD_MS
) -> Verdict:
    """Would a request of `cost` fit a bucket of `limit` per `period_ms` at `now_ms`?"""
    interval = period_ms / limit
    base = now_ms if tat_ms is None or tat_ms < now_ms else tat_ms
    after = base + cost * interval
    if after - now_ms <= period_ms + _EPS:
        remaining = math.floor((period_ms - (after - now_ms)) / interval + _EPS)
        return Verdict(True, limit, max(0, remaining), after - now_ms, 0.0, after)
    remaining = math.floor((period_ms - (base - now_ms)) / interval + _EPS)
    retry = math.inf if cost > limit else after - period_ms - now_ms
    return Verdict(False, limit, max(0, remaining), base - now_ms, retry, base)


def charge(
    tat_ms: float | None, now_ms: float, limit: int, cost: float, period_ms: float = PERIOD_MS
) -> float | None:
    """The TAT after charging `cost` without asking (negative: a refund).

    Settlement at a request's end charges the difference between the tokens it used
    and the tokens it reserved. A debt is kept to at most one period (TAT <= now + T),
    so one request that ran far past its reservation refuses its key for at most a
    minute; None means the bucket is full (nothing to store).
    """
    interval = period_ms / limit
    base = now_ms if tat_ms is None or tat_ms < now_ms else tat_ms
    after = min(base + cost * interval, now_ms + period_ms)
    return after if after > now_ms else None
