"""The engine's request arrivals: a closed loop of C clients, or fixed arrival times."""

from __future__ import annotations

import math

from bench.twin.requests import TwinRequest


class Arrivals:
    """Closed loop (C clients) or fixed arrival times, over the request list in order.

    `next_at` is when the next request is due (-inf: now, inf: none until a client is
    freed, or none left), so that the engine's step loop tests one float per step."""

    __slots__ = ("_next", "_ready", "_requests", "_times", "next_at")

    def __init__(self, requests: list[TwinRequest], times: list[float] | None, clients: int):
        self._requests = requests
        self._times = times
        self._next = 0
        #: Closed loop: requests whose client is free now (arrive at the current time).
        self._ready = min(clients, len(requests)) if times is None else 0
        self.next_at = math.inf
        self._update()

    def _update(self) -> None:
        more = self._next < len(self._requests)
        if self._times is None:
            self.next_at = -math.inf if more and self._ready else math.inf
        else:
            self.next_at = self._times[self._next] if more else math.inf

    def due(self, now: float) -> list[tuple[TwinRequest, float]]:
        out = []
        n = len(self._requests)
        if self._times is None:
            while self._ready and self._next < n:
                out.append((self._requests[self._next], now))
                self._next += 1
                self._ready -= 1
        else:
            times = self._times
            while self._next < n and times[self._next] <= now:
                out.append((self._requests[self._next], times[self._next]))
                self._next += 1
        self._update()
        return out

    def freed(self) -> None:
        """A closed-loop client's request finished: it sends its next one now."""
        if self._times is None:
            self._ready += 1
            if self._next < len(self._requests):
                self.next_at = -math.inf

    def next_time(self) -> float | None:
        if self._times is not None and self._next < len(self._requests):
            return self._times[self._next]
        return None
