"""A request's times at the gateway: arrival, the start of its admission wait, admission.

The engine's own latencies (`RequestOutcome.ttft_s`) start when vLLM receives the
request, after the gateway parsed, classified and admitted it; a queue in front of
the engine is invisible there. So the edge gate stamps the arrival
(`InferenceService.enter` calls `stamp_arrival`, before the body is parsed) and
the service keeps the rest, which gives

    time to first token at the gateway = (admitted - arrived) + engine TTFT

(the serving layer's template rendering and tokenisation, before vLLM's own
arrival stamp, fall between the two terms; they take milliseconds).

A context variable carries the arrival from the gate to the route: both run in
the request's task (the route's child tasks copy its context). It is read once,
so a request that did not pass the gate never takes another's stamp.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass

_ARRIVED: ContextVar[float | None] = ContextVar("specgw_arrived", default=None)


def stamp_arrival() -> None:
    """The request being handled arrived now (monotonic clock)."""
    _ARRIVED.set(time.monotonic())


@dataclass(slots=True)
class RequestClock:
    """Monotonic times of one request; `admitted` is None until it has its slot."""

    arrived: float
    queued: float
    admitted: float | None = None

    @classmethod
    def start(cls) -> RequestClock:
        """At the admission queue: the arrival stamp if the gate left one, else now."""
        now = time.monotonic()
        arrived = _ARRIVED.get()
        _ARRIVED.set(None)
        return cls(arrived if arrived is not None and arrived <= now else now, now)

    def admit(self) -> None:
        self.admitted = time.monotonic()

    @property
    def admission_wait_s(self) -> float | None:
        """Seconds in the admission queue (None: never admitted)."""
        return None if self.admitted is None else self.admitted - self.queued

    @property
    def before_engine_s(self) -> float | None:
        """Seconds from arrival to admission: parsing, classification and the queue."""
        return None if self.admitted is None else self.admitted - self.arrived

    def since_queued_s(self) -> float:
        return time.monotonic() - self.queued
