"""Engine readiness as the gateway sees it, kept current with or without traffic.

A stopped or deadlocked engine core that holds no request is asked nothing, so
nothing notices it: vLLM turns `errored` only when the core process exits, and the
stall bound (`EngineHealth.stalled_for_s`) needs admitted work. So while no work is
in flight the watch sends the engine a canary every `interval_s`: one round trip
to the engine core with no request (`EngineProbe.ping`; on vLLM a utility call its
busy loop answers between steps: no token, no `vllm:*` count).
A canary unanswered after `timeout_s` marks the engine hung; its late answer marks
it ready again. With work in flight the stall bound judges instead: a canary
queues behind the running step, and a long prefill step is slow, not hung.

One canary is in flight at a time, so a stopped core does not pile them up. The
watch publishes every change of state (`specgw_engine_ready`, `specgw_engine_state`)
at once: on its own ticks, on a canary's answer, when the supervisor or the drain
pokes it, and when `/ready` asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.interface import EngineHealth, EngineProbe
from gateway.clock import MONOTONIC, Clock, wait_for

log = logging.getLogger("specgw.engine")


class EngineState(enum.StrEnum):
    """The engine as the gateway sees it; the replica serves only in `READY`."""

    READY = "ready"
    #: Started, not ready, nothing stalled (warming up).
    STARTING = "starting"
    #: A canary outlived its deadline, or admitted work produced nothing for the stall bound.
    HUNG = "hung"
    #: SIGTERM: admission is closed while in-flight requests finish.
    DRAINING = "draining"
    #: The engine core process is gone and the supervisor has not reacted yet.
    DEAD = "dead"
    #: The supervisor is replacing a dead engine core.
    RESTARTING = "restarting"
    #: No engine could be restarted: the process is exiting non-zero.
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Conditions:
    """What the runtime knows beyond the engine's own health."""

    restarting: bool = False
    failed: bool = False
    draining: bool = False


def engine_state(
    health: EngineHealth, conditions: Conditions, *, canary_overdue: bool = False
) -> EngineState:
    """The first state that holds, from the most to the least severe."""
    if conditions.failed:
        return EngineState.FAILED
    if conditions.restarting:
        return EngineState.RESTARTING
    if not health.alive:
        return EngineState.DEAD
    if canary_overdue or (not health.ready and health.stalled_for_s > 0):
        return EngineState.HUNG
    if conditions.draining:
        return EngineState.DRAINING
    if not health.ready:
        return EngineState.STARTING
    return EngineState.READY


class EngineWatch:
    """Sends the canary, folds it into the state, publishes every change.

    `engine()` returns the current engine (a restart replaces it); `conditions()`
    the runtime's side; `publish(state)` sets the metrics. `interval_s = 0` turns
    the canary off (the state is still kept current). Its ticks, deadlines and
    `hung_for_s` run on `clock`.
    """

    def __init__(
        self,
        engine: Callable[[], Any],
        conditions: Callable[[], Conditions],
        publish: Callable[[EngineState], None],
        *,
        interval_s: float,
        timeout_s: float,
        clock: Clock = MONOTONIC,
    ) -> None:
        self._engine = engine
        self._clock = clock
        self._conditions = conditions
        self._publish = publish
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._ping: asyncio.Task[None] | None = None
        self._pinged: Any = None
        self._sent_at = float("-inf")
        self._failure = ""
        self._poke = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.state: EngineState | None = None
        #: When the engine last turned hung (None while it is not).
        self._hung_since: float | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        for task in (self._task, self._ping):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    def poke(self) -> None:
        """Re-check now (the supervisor, the drain and a canary's answer call this)."""
        self._poke.set()

    async def check(self) -> tuple[EngineState, EngineHealth]:
        """Ask the engine's health, run the canary's bookkeeping, publish a change."""
        engine = self._engine()
        health: EngineHealth = await engine.health()
        return self.observe(engine, health), health

    def observe(self, engine: Any, health: EngineHealth) -> EngineState:
        now = self._clock.now()
        self._collect(engine)
        if self._ping is None and self._due(health, now) and isinstance(engine, EngineProbe):
            self._send(engine, now)
        state = engine_state(health, self._conditions(), canary_overdue=self.overdue_s(now) > 0)
        if state != self.state:
            if self.state is not None:
                log.warning("engine %s -> %s%s", self.state, state, self._why(state, now))
            self.state = state
            self._hung_since = now if state is EngineState.HUNG else None
            self._publish(state)
        return state

    def hung_for_s(self, now: float | None = None) -> float:
        """Seconds the engine has been hung without a break (0 when it is not)."""
        if self._hung_since is None:
            return 0.0
        return (self._clock.now() if now is None else now) - self._hung_since

    def overdue_s(self, now: float | None = None) -> float:
        """Seconds the canary in flight is past its deadline (0 when none is)."""
        if self._ping is None and not self._failure:
            return 0.0
        if self._failure:
            return self._timeout_s  # the engine answered with an error: as good as no answer
        now = self._clock.now() if now is None else now
        return max(0.0, now - self._sent_at - self._timeout_s)

    def describe(self, state: EngineState, health: EngineHealth) -> str:
        """The `/ready` detail for the engine: `ready`, or what is wrong."""
        if state is EngineState.READY:
            return "ready"
        why = self._why(state, self._clock.now()).removeprefix(": ")
        return why or health.detail or state.value

    def _why(self, state: EngineState, now: float) -> str:
        if state is not EngineState.HUNG or not (self._ping or self._failure):
            return ""
        if self._failure:
            return f": the canary failed: {self._failure}"
        return f": no answer to the canary for {now - self._sent_at:.1f} s"

    def _due(self, health: EngineHealth, now: float) -> bool:
        idle = health.alive and health.stalled_for_s == 0.0
        return self._interval_s > 0 and idle and now - self._sent_at >= self._interval_s

    def _send(self, engine: EngineProbe, now: float) -> None:
        self._ping = asyncio.get_running_loop().create_task(engine.ping())
        self._ping.add_done_callback(lambda _: self.poke())
        self._pinged, self._sent_at = engine, now

    def _collect(self, engine: Any) -> None:
        """Take a finished canary's answer; drop one sent to an engine since replaced."""
        ping = self._ping
        if ping is None:
            if self._failure and self._pinged is not engine:
                self._failure, self._sent_at = "", float("-inf")
            return
        if self._pinged is not engine:
            ping.cancel()  # the new engine gets its own canary at once
            self._ping, self._failure, self._sent_at = None, "", float("-inf")
            return
        if not ping.done():
            return
        self._ping = None
        if ping.cancelled():
            return
        error = ping.exception()
        self._failure = f"{type(error).__name__}: {error}" if error is not None else ""

    async def _run(self) -> None:
        while True:
            self._poke.clear()  # before the check: a poke during it means check again
            try:
                await self.check()
            except Exception:  # a failing health call must not end the watch
                log.exception("engine readiness check failed")
            wait = self._interval_s or 1.0
            deadline = self._sent_at + self._timeout_s - self._clock.now()
            if self._ping is not None and deadline > 0:
                wait = min(wait, deadline + 0.01)  # publish `hung` as the deadline passes
            with contextlib.suppress(TimeoutError):
                await wait_for(self._clock, self._poke.wait(), wait)
