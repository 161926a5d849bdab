"""Exponential reconnect delay with full jitter, shared by the Redis loops.

Full jitter (delay uniform in [0, min(cap, base * 2**n)]) spreads replicas
that lost Redis at the same moment, so they do not reconnect in lockstep
(AWS Architecture Blog, "Exponential Backoff And Jitter", 2015).
"""

from __future__ import annotations

import asyncio
import contextlib
import random


class Backoff:
    """Next delay after each failure; `reset()` after a success."""

    def __init__(self, initial_s: float, max_s: float, rng: random.Random | None = None) -> None:
        self._initial = initial_s
        self._max = max_s
        self._failures = 0
        self._rng = rng or random.Random()

    @property
    def failures(self) -> int:
        return self._failures

    def next_delay(self) -> float:
        ceiling = min(self._max, self._initial * (2 ** min(self._failures, 30)))
        self._failures += 1
        # Never below the initial delay: a zero sleep would spin on a dead server.
        return max(self._initial, self._rng.uniform(0, ceiling))

    def reset(self) -> None:
        self._failures = 0


async def stop_task(task: asyncio.Task[None], grace_s: float) -> None:
    """Cancel a background loop and wait until it has really ended.

    A cancel that lands while redis-py's read timeout fires can be taken for the
    timeout and swallowed (the loop then reads on), so the cancel is repeated
    until the task is done; the loops also check a stop flag of their own.
    """
    while not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait({task}, timeout=grace_s)
    with contextlib.suppress(asyncio.CancelledError):
        await task
