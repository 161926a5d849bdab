"""Engine supervision on the scripted `FakeEngine`: a dead engine core is replaced, and
when it cannot be, the replica gives up so the process exits non-zero.
"""

from __future__ import annotations

import contextlib

from engine.fake import FakeEngine
from gateway.supervisor import EngineSupervisor
from tests.clock import until


class ScriptedSlot:
    """The part of `EngineSlot` the supervisor uses; `fail_starts` restarts fail first."""

    def __init__(self, fail_starts: int = 0) -> None:
        self.engine = FakeEngine()
        self.fail_starts = fail_starts
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        if self.starts <= self.fail_starts:
            raise RuntimeError("engine core failed to start")
        self.engine = FakeEngine()

    async def close(self) -> None:
        await self.engine.shutdown()


async def supervise(slot: ScriptedSlot, events: list[str], max_restarts: int = 3) -> None:
    """Kill the engine core under a running supervisor; return once it has reacted."""
    supervisor = EngineSupervisor(
        slot,  # type: ignore[arg-type]
        on_down=lambda: events.append("down"),
        on_up=lambda _: events.append("up"),
        on_fatal=lambda: events.append("fatal"),
        interval_s=0.01,
        max_restarts=max_restarts,
        backoff_s=0.001,
    )
    supervisor.start()
    slot.engine.kill()
    with contextlib.suppress(AssertionError):  # what the test asserts on comes after
        await until(lambda: events[-1:] in (["up"], ["fatal"]), 5.0)
    await supervisor.close()


async def test_a_dead_engine_is_restarted_after_failed_attempts() -> None:
    slot, events = ScriptedSlot(fail_starts=2), []
    await supervise(slot, events)
    assert events == ["down", "up"]
    assert slot.starts == 3
    assert (await slot.engine.health()).alive


async def test_an_engine_that_cannot_restart_is_fatal_after_bounded_retries() -> None:
    slot, events = ScriptedSlot(fail_starts=99), []
    await supervise(slot, events, max_restarts=3)
    assert events == ["down", "fatal"]
    assert slot.starts == 3
