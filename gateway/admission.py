"""Admission control: bounded running set, bounded queue, per-class fairness.

Two stages. At the edge, before its body is even parsed, a request takes a
ticket (`enter`): at most `max_running + max_queued` requests are inside the
gateway at once, and one more is shed at once with 429 + retry-after. Parsing,
validation and chat rendering cost milliseconds per request on one event loop,
so a burst that were only shed after parsing would wait for every request ahead
of it to be parsed; the bound is 50 ms (`tests/reliability/test_overload.py`).
Then, classified, a request is admitted at once while fewer than `max_running`
run and nobody waits;
otherwise it queues behind its own class. Freed slots go to the classes
in round-robin order, so a flood of one class (say, long tool-call prompts)
cannot starve the others. A full queue sheds at once with 429 + retry-after
(never by timing out), and a queued request that waits past `queue_timeout_s`
also gets 429. While draining (SIGTERM), new requests get 503 + retry-after.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.errors import ErrorKind, GatewayError


class Admission:
    def __init__(self, max_running: int, max_queued: int, queue_timeout_s: float) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        self.running = 0
        #: Tickets taken at the edge and not yet returned (parsing, queued or running).
        self.inside = 0
        self.draining = False
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()
        self._queued = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def queued(self) -> int:
        return self._queued

    def _shed(self, kind: ErrorKind, message: str) -> GatewayError:
        return GatewayError(kind, message, retry_after_s=1)

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise self._shed(ErrorKind.DRAINING, "The gateway is shutting down; retry elsewhere.")

    def enter(self) -> None:
        """Take an edge ticket, or raise the 429 / 503 that sheds the request now."""
        self._refuse_if_draining()
        if self.inside >= self.max_running + self.max_queued:
            raise self._shed(ErrorKind.OVERLOADED, "Too many requests in flight; retry shortly.")
        self.inside += 1

    def leave(self) -> None:
        self.inside -= 1

    @asynccontextmanager
    async def slot(self, class_id: str) -> AsyncIterator[None]:
        await self.acquire(class_id)
        try:
            yield
        finally:
            self.release()

    async def acquire(self, class_id: str) -> None:
        self._refuse_if_draining()
        if self.running < self.max_running and self._queued == 0:
            self._take()
            return
        if self._queued >= self.max_queued:
            raise self._shed(ErrorKind.OVERLOADED, "Too many requests queued; retry shortly.")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(class_id, deque()).append(fut)
        self._queued += 1
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.queue_timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            if fut.done() and not fut.cancelled():
                # Granted just as we gave up: hand the slot on.
                self.release()
            else:
                fut.cancel()
                self._forget(class_id, fut)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise self._shed(
                ErrorKind.OVERLOADED, "Timed out waiting for admission; retry shortly."
            ) from None

    def _forget(self, class_id: str, fut: asyncio.Future[None]) -> None:
        queue = self._queues.get(class_id)
        if queue is not None and fut in queue:
            queue.remove(fut)
            self._queued -= 1
            if not queue:
                del self._queues[class_id]

    def _take(self) -> None:
        self.running += 1
        self._idle.clear()

    def release(self) -> None:
        self.running -= 1
        while self._queues and self.running < self.max_running:
            class_id, queue = next(iter(self._queues.items()))
            fut = queue.popleft()
            self._queued -= 1
            if queue:
                self._queues.move_to_end(class_id)  # round-robin across classes
            else:
                del self._queues[class_id]
            if not fut.done():
                self._take()
                fut.set_result(None)
        if self.running == 0:
            self._idle.set()

    async def drain(self, timeout_s: float) -> bool:
        """Stop admitting; wait for running requests. True if all finished in time."""
        self.draining = True
        for queue in self._queues.values():
            for fut in queue:
                if not fut.done():
                    fut.set_exception(
                        self._shed(ErrorKind.DRAINING, "The gateway is shutting down.")
                    )
        self._queues.clear()
        self._queued = 0
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True
