"""Admission control: bounded running set, bounded queue, fair shares by key, then by class.

Two stages. At the edge, before its body is even parsed, a request takes a
ticket (`enter`): at most `max_running + max_queued` requests are inside the
gateway at once, and one more is shed at once with 429 + retry-after. Parsing,
validation and chat rendering cost milliseconds per request on one event loop,
so a burst that were only shed after parsing would wait for every request ahead
of it to be parsed; the bound is 50 ms (`tests/reliability/test_overload.py`).
Then, classified, a request is admitted at once while fewer than `max_running`
run and nobody waits; otherwise it queues behind its key, and within the key
behind its class.

By key first, then by class. A freed slot goes to the waiting key with the
lowest `(running + 1) / weight` (ties: the one served least recently), and within that
key to its classes in round-robin order. Key first, because class first cannot
bound a key's share: a key that floods two classes would get both classes'
turns, and a key that shares one class with it would get half of one. With key
first, a key's flood never holds more than its weighted share of the running
slots while another key waits, whatever classes either sends; the round-robin
within a key keeps the old guarantee that one class of a key (say, its long
tool-call prompts) cannot starve its other classes. The bound: a waiting key
whose running count is below its share gets every slot freed until it reaches
its share, so its first `share` requests each wait for at most that many
releases (`tests/tenants/test_fair_admission.py` measures it). Slots left
unused by a key go to the others (work-conserving): a lone key may use them all.

The same share guards the two bounds. The queue: when it is full, a request of a
key below its weighted share of the queue pushes out the newest waiter of the key
furthest above its share (that one gets the 429) instead of being shed itself.
The edge: a key holding fewer edge tickets than its weighted share of
`max_running + max_queued` may enter a full gateway, so one key's burst cannot
keep another out before parsing; the overshoot is at most one share per key.

A full queue sheds at once with 429 + retry-after (never by timing out), and a
queued request that waits past `queue_timeout_s` also gets 429. While draining
(SIGTERM), new requests get 503 + retry-after. The queue timeout and the drain's
wait run on the injected clock.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from gateway.clock import MONOTONIC, Clock, wait_for
from gateway.errors import ErrorKind, GatewayError

#: The key of requests that name none (no API keys configured).
ANY_KEY = "anonymous"


@dataclass(slots=True)
class _Waiter:
    future: asyncio.Future[None]
    key: str
    class_id: str
    seq: int


@dataclass(slots=True)
class _Key:
    """One key's share of the gateway: its tickets, running slots and waiters by class."""

    weight: float
    inside: int = 0
    running: int = 0
    queued: int = 0
    #: Order of this key's latest grant from the queue (-1: never): ties go to the key
    #: served least recently, so keys at equal shares take turns.
    last_grant: int = -1
    classes: OrderedDict[str, deque[_Waiter]] = field(default_factory=OrderedDict)

    @property
    def idle(self) -> bool:
        return self.inside == 0 and self.running == 0 and self.queued == 0

    def head_seq(self) -> int:
        return min(queue[0].seq for queue in self.classes.values())

    def pop_next(self) -> _Waiter:
        """The head of the next class in round-robin order."""
        class_id, queue = next(iter(self.classes.items()))
        waiter = queue.popleft()
        if queue:
            self.classes.move_to_end(class_id)
        else:
            del self.classes[class_id]
        self.queued -= 1
        return waiter

    def pop_newest(self) -> _Waiter:
        class_id, queue = max(self.classes.items(), key=lambda item: item[1][-1].seq)
        waiter = queue.pop()
        if not queue:
            del self.classes[class_id]
        self.queued -= 1
        return waiter


class Admission:
    def __init__(
        self,
        max_running: int,
        max_queued: int,
        queue_timeout_s: float,
        weight_of: Callable[[str], float] = lambda key: 1.0,
        *,
        clock: Clock = MONOTONIC,
    ) -> None:
        self.max_running = max_running
        self.max_queued = max_queued
        self.queue_timeout_s = queue_timeout_s
        self.running = 0
        #: Tickets taken at the edge and not yet returned (parsing, queued or running).
        self.inside = 0
        self.draining = False
        self._weight_of = weight_of
        self._clock = clock
        self._keys: dict[str, _Key] = {}
        self._queued = 0
        self._seq = itertools.count()
        self._grants = itertools.count()
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def queued(self) -> int:
        return self._queued

    def load_by_key(self) -> dict[str, tuple[int, int]]:
        """Key -> (running, queued), for the per-key gauges."""
        return {key: (k.running, k.queued) for key, k in self._keys.items()}

    def _key(self, key: str) -> _Key:
        state = self._keys.get(key)
        if state is None:
            state = self._keys[key] = _Key(self._weight_of(key))
        return state

    def _forget_if_idle(self, key: str) -> None:
        state = self._keys.get(key)
        if state is not None and state.idle:
            del self._keys[key]

    def _share(self, total: int, key: str, active: Callable[[_Key], bool]) -> float:
        """`key`'s weighted share of `total` among the keys `active` holds for (and it)."""
        mine = self._key(key).weight
        weights = sum(k.weight for name, k in self._keys.items() if name != key and active(k))
        return total * mine / (mine + weights)

    def _shed(self, kind: ErrorKind, message: str) -> GatewayError:
        return GatewayError(kind, message, retry_after_s=1)

    def _refuse_if_draining(self) -> None:
        if self.draining:
            raise self._shed(ErrorKind.DRAINING, "The gateway is shutting down; retry elsewhere.")

    def enter(self, key: str = ANY_KEY) -> None:
        """Take an edge ticket, or raise the 429 / 503 that sheds the request now."""
        self._refuse_if_draining()
        state = self._key(key)
        total = self.max_running + self.max_queued
        if self.inside >= total and state.inside + 1 > self._share(total, key, _inside):
            self._forget_if_idle(key)
            raise self._shed(ErrorKind.OVERLOADED, "Too many requests in flight; retry shortly.")
        self.inside += 1
        state.inside += 1

    def leave(self, key: str = ANY_KEY) -> None:
        self.inside -= 1
        state = self._keys.get(key)
        if state is not None:
            state.inside -= 1
            self._forget_if_idle(key)

    @asynccontextmanager
    async def slot(self, class_id: str, key: str = ANY_KEY) -> AsyncIterator[None]:
        await self.acquire(class_id, key)
        try:
            yield
        finally:
            self.release(key)

    async def acquire(self, class_id: str, key: str = ANY_KEY) -> None:
        self._refuse_if_draining()
        if self.running < self.max_running and self._queued == 0:
            self._take(key)
            return
        waiter = self._enqueue(class_id, key)
        try:
            await wait_for(self._clock, asyncio.shield(waiter.future), self.queue_timeout_s)
        except (TimeoutError, asyncio.CancelledError) as exc:
            fut = waiter.future
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                # Granted just as we gave up: hand the slot on.
                self.release(key)
            else:
                fut.cancel()
                self._forget(waiter)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise self._shed(
                ErrorKind.OVERLOADED, "Timed out waiting for admission; retry shortly."
            ) from None

    def _enqueue(self, class_id: str, key: str) -> _Waiter:
        """Queue a request, pushing out a waiter of an over-share key when full."""
        if self._queued >= self.max_queued:
            victim = self._victim_for(key)
            if victim is None:
                self._forget_if_idle(key)
                raise self._shed(ErrorKind.OVERLOADED, "Too many requests queued; retry shortly.")
            waiter = self._keys[victim].pop_newest()
            self._queued -= 1
            waiter.future.set_exception(
                self._shed(ErrorKind.OVERLOADED, "Too many requests queued; retry shortly.")
            )
        state = self._key(key)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(future, key, class_id, next(self._seq))
        state.classes.setdefault(class_id, deque()).append(waiter)
        state.queued += 1
        self._queued += 1
        return waiter

    def _victim_for(self, key: str) -> str | None:
        """The key whose newest waiter makes room for `key`: the one furthest above its
        weighted share of the queue, if `key` (with this request) is still below it."""
        if self.max_queued == 0:
            return None
        mine = self._key(key)
        pressure = {name: k.queued / k.weight for name, k in self._keys.items() if k.queued}
        if not pressure:
            return None
        heaviest = max(pressure, key=lambda name: pressure[name])
        if heaviest == key or pressure[heaviest] <= (mine.queued + 1) / mine.weight:
            return None
        return heaviest

    def _forget(self, waiter: _Waiter) -> None:
        state = self._keys.get(waiter.key)
        queue = state.classes.get(waiter.class_id) if state is not None else None
        if state is None or queue is None or waiter not in queue:
            return
        queue.remove(waiter)
        if not queue:
            del state.classes[waiter.class_id]
        state.queued -= 1
        self._queued -= 1
        self._forget_if_idle(waiter.key)

    def _take(self, key: str) -> None:
        self.running += 1
        self._key(key).running += 1
        self._idle.clear()

    def release(self, key: str = ANY_KEY) -> None:
        self.running -= 1
        state = self._keys.get(key)
        if state is not None:
            state.running -= 1
            self._forget_if_idle(key)
        while self._queued and self.running < self.max_running:
            waiter = self._next_waiter()
            if not waiter.future.done():
                self._take(waiter.key)
                waiter.future.set_result(None)
        if self.running == 0:
            self._idle.set()

    def _next_waiter(self) -> _Waiter:
        """The head of the waiting key with the lowest (running + 1) / weight."""
        waiting = [k for k in self._keys.values() if k.queued]
        best = min(waiting, key=lambda k: ((k.running + 1) / k.weight, k.last_grant, k.head_seq()))
        best.last_grant = next(self._grants)
        self._queued -= 1
        return best.pop_next()

    async def drain(self, timeout_s: float) -> bool:
        """Stop admitting; wait for running requests. True if all finished in time."""
        self.draining = True
        for state in self._keys.values():
            for queue in state.classes.values():
                for waiter in queue:
                    if not waiter.future.done():
                        waiter.future.set_exception(
                            self._shed(ErrorKind.DRAINING, "The gateway is shutting down.")
                        )
            state.classes.clear()
            state.queued = 0
        self._queued = 0
        for key in list(self._keys):
            self._forget_if_idle(key)
        try:
            await wait_for(self._clock, self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


def _inside(state: _Key) -> bool:
    return state.inside > 0
