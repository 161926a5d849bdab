"""Time as the gateway's own timers read it: one seam, so that a test moves time instead
of waiting for it.

A `Clock` is two methods: `now()` (seconds on a monotonic scale) and
`call_later(delay, callback)` (a timer that can be cancelled). Production runs on
`MONOTONIC`: `time.monotonic` and the running event loop's timers, which is what
`asyncio.sleep` and `asyncio.timeout` use. `ManualClock` moves only when its owner
calls `advance`: each timer due by then fires at its own time, in deadline order, and
the event loop runs between two timers, so whatever one timer woke has run before the
next one is due (the order a real clock gives, without the wait).

`sleep`, `timeout` and `wait_for` are asyncio's, on any clock. `timeout` keeps
`asyncio.timeout`'s rule for telling its own cancellation from anyone else's: it
cancels the task at the deadline and, on the way out, turns that cancellation into
`TimeoutError` only if `Task.uncancel` shows no other cancel request came since it
was entered.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Protocol, TypeVar

T = TypeVar("T")


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Monotonic seconds and timers on them."""

    def now(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer: ...


class MonotonicClock:
    """The real clock: `time.monotonic` (the default event loop's `time()`) and the
    running loop's `call_later`."""

    def now(self) -> float:
        return time.monotonic()

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback)


MONOTONIC: Clock = MonotonicClock()


async def sleep(clock: Clock, seconds: float) -> None:
    """`asyncio.sleep(seconds)` on `clock`; 0 or less only yields to the loop once."""
    if seconds <= 0:
        await asyncio.sleep(0)
        return
    woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake() -> None:
        if not woken.done():
            woken.set_result(None)

    timer = clock.call_later(seconds, wake)
    try:
        await woken
    finally:
        timer.cancel()


class timeout:
    """`async with timeout(clock, delay)`: `asyncio.timeout(delay)` on `clock`."""

    __slots__ = ("_base", "_clock", "_delay", "_expired", "_task", "_timer")

    def __init__(self, clock: Clock, delay: float) -> None:
        self._clock, self._delay = clock, delay
        self._expired = False
        self._task: asyncio.Task[object] | None = None
        self._timer: Timer | None = None
        self._base = 0

    @property
    def expired(self) -> bool:
        return self._expired

    async def __aenter__(self) -> timeout:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("timeout() needs a running task")
        self._task, self._base = task, task.cancelling()
        self._timer = self._clock.call_later(self._delay, self._expire)
        return self

    def _expire(self) -> None:
        assert self._task is not None
        self._expired = True
        self._timer = None
        self._task.cancel()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._expired:
            return
        assert self._task is not None
        if self._task.uncancel() <= self._base and exc_type is asyncio.CancelledError:
            raise TimeoutError from exc


async def wait_for(clock: Clock, awaitable: Awaitable[T], timeout_s: float) -> T:
    """`asyncio.wait_for(awaitable, timeout_s)` on `clock` (awaited in this task)."""
    async with timeout(clock, timeout_s):
        return await awaitable


@dataclass(order=True, slots=True)
class _ManualTimer:
    when: float
    seq: int
    callback: Callable[[], object] = field(compare=False)
    cancelled: bool = field(default=False, compare=False)

    def cancel(self) -> None:
        self.cancelled = True


#: Loop iterations `ManualClock.settle` runs: each wakes one more hop of a chain of
#: callbacks, futures and tasks (a timer cancels a task, whose handler sets an event,
#: whose waiter returns...); the gateway's deepest chain in the unit tier is well under it.
SETTLE_ROUNDS = 20


class ManualClock:
    """A clock that stands still until `advance` moves it (the tests' clock)."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start
        self._timers: list[_ManualTimer] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], object]) -> Timer:
        timer = _ManualTimer(self._now + max(0.0, delay), next(self._seq), callback)
        heapq.heappush(self._timers, timer)
        return timer

    @property
    def pending(self) -> int:
        """Timers armed and not cancelled."""
        return sum(not t.cancelled for t in self._timers)

    def next_due_s(self) -> float | None:
        """Seconds until the next armed timer fires (None: none is armed)."""
        due = [t.when for t in self._timers if not t.cancelled]
        return min(due) - self._now if due else None

    async def settle(self) -> None:
        """Let the event loop run what is ready, time standing still."""
        for _ in range(SETTLE_ROUNDS):
            await asyncio.sleep(0)

    async def advance(self, seconds: float) -> None:
        """Move time on by `seconds`, firing each timer due by then at its own time."""
        target = self._now + seconds
        await self.settle()
        while self._timers and self._timers[0].when <= target:
            timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, timer.when)
            timer.callback()
            await self.settle()
        self._now = target
        await self.settle()
