"""Hands each finished request's engine outcome to the request that is waiting for it.

The engine's serving client calls `deliver(gateway_id, outcome)` when vLLM
reports a request finished, before vLLM's serving layer renders the final
chunk, so the outcome is normally there when the gateway needs it; `wait` covers
the rest with a short bound. Unclaimed outcomes are dropped after `ttl_s` so an
aborted request cannot leak an entry.
"""

from __future__ import annotations

import asyncio
import time

from engine.interface import RequestOutcome


class OutcomeBoard:
    def __init__(self, ttl_s: float = 60.0) -> None:
        self._ttl_s = ttl_s
        self._waiters: dict[str, asyncio.Future[RequestOutcome]] = {}
        self._created: dict[str, float] = {}

    def expect(self, gateway_id: str) -> None:
        """Register interest before the request reaches the engine."""
        self._waiters[gateway_id] = asyncio.get_running_loop().create_future()
        self._created[gateway_id] = time.monotonic()

    def deliver(self, gateway_id: str, outcome: RequestOutcome) -> None:
        fut = self._waiters.get(gateway_id)
        if fut is not None and not fut.done():
            fut.set_result(outcome)

    def peek(self, gateway_id: str) -> RequestOutcome | None:
        fut = self._waiters.get(gateway_id)
        if fut is not None and fut.done():
            return fut.result()
        return None

    async def wait(self, gateway_id: str, timeout_s: float = 1.0) -> RequestOutcome | None:
        fut = self._waiters.get(gateway_id)
        if fut is None:
            return None
        try:
            return await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except TimeoutError:
            return None

    def discard(self, gateway_id: str) -> None:
        self._waiters.pop(gateway_id, None)
        self._created.pop(gateway_id, None)
        self._sweep()

    def _sweep(self) -> None:
        if len(self._created) < 256:
            return
        cutoff = time.monotonic() - self._ttl_s
        for gid in [g for g, t in self._created.items() if t < cutoff]:
            self.discard(gid)

    def __len__(self) -> int:
        return len(self._waiters)
