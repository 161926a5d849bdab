"""Waiting in the unit tier without sleeping on the wall clock.

Two ways, by what moves time:

* the gateway's own timers (the engine watch, admission, the flag view) run on an
  injected `gateway.clock.ManualClock`: the test advances it and nothing waits;
* a real process or thread (redis-server, Prometheus, flagd's file watcher, a server
  thread) makes a condition true when it gets there: `until` / `until_sync` poll it,
  bounded by a deadline that only a hang reaches, so a loaded host makes them slower,
  never wrong.

The unit tier's guard (`tests/tier_guard.py`) refuses any other real-clock sleep in
test code: a fixed sleep waits longer than it must, or on a loaded host not long
enough. The sleeps below are the polls' own, and the one place it allows them.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")

#: Seconds between two looks at the condition.
POLL_S = 0.01


async def until(
    condition: Callable[[], object],
    timeout_s: float = 10.0,
    what: str = "condition",
    poll_s: float = POLL_S,
) -> float:
    """Seconds until `condition()` (or the awaitable it returns) is truthy; an
    AssertionError naming `what` after `timeout_s`."""
    start = time.monotonic()
    while True:
        value = condition()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        await asyncio.sleep(poll_s)


async def until_value(
    read: Callable[[], Awaitable[T]],
    done: Callable[[T], bool],
    timeout_s: float = 10.0,
    poll_s: float = POLL_S,
) -> T:
    """The first `await read()` that `done` accepts, or the last one read by `timeout_s`
    (the caller's assertion on it then says what was wrong)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await read()
        if done(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(poll_s)


def until_sync(
    condition: Callable[[], object],
    timeout_s: float = 10.0,
    what: str = "condition",
    poll_s: float = POLL_S,
) -> float:
    """`until` for a thread or process the test waits on without an event loop."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s} s")
        time.sleep(poll_s)
    return time.monotonic() - start
