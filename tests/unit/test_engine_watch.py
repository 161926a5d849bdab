"""Engine readiness without traffic: the idle canary finds a stopped engine core, and
`specgw_engine_ready` / `/ready` follow dead, hung, restarting and draining engines.

In process on the fake backend: `FakeEngine.wedge()` plays SIGSTOP of the engine
core (steps and pings wait), `resume()` SIGCONT, `kill()` the core dying. The same
checks on the real engine (SIGSTOP of vLLM's EngineCore process) are in
tests/engine/test_idle_hang.py.
"""

from __future__ import annotations

import asyncio

import pytest

from engine.interface import EngineDeadError, EngineHealth
from gateway.clock import ManualClock
from gateway.engine_watch import Conditions, EngineState, EngineWatch, engine_state
from tests.clock import until
from tests.unit.conftest import InProcessGateway, gateway_settings, serve_in_process
from tests.unit.test_ops import samples

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: Production's canary: every 2 s, answered within 5 s. The watch runs on a
#: `ManualClock`, so the in-process tests move its time instead of waiting for it.
INTERVAL_S, TIMEOUT_S = 2.0, 5.0
CANARY = {"canary_interval_s": INTERVAL_S, "canary_timeout_s": TIMEOUT_S}
#: From a canary's send until the watch publishes it hung: its deadline, and the 10 ms
#: the watch's loop waits past it.
UNANSWERED_S = TIMEOUT_S + 0.02
UP = EngineHealth(alive=True, ready=True)
STALLED = EngineHealth(alive=True, ready=False, stalled_for_s=9.0)
WARMING = EngineHealth(alive=True, ready=False, detail="warming up")
GONE = EngineHealth(alive=False, ready=False, detail="engine core died")


@pytest.mark.parametrize(
    ("health", "conditions", "overdue", "expected"),
    [
        (UP, Conditions(), False, EngineState.READY),
        (UP, Conditions(), True, EngineState.HUNG),
        (STALLED, Conditions(), False, EngineState.HUNG),
        (WARMING, Conditions(), False, EngineState.STARTING),
        (GONE, Conditions(), True, EngineState.DEAD),
        (UP, Conditions(draining=True), False, EngineState.DRAINING),
        (UP, Conditions(draining=True), True, EngineState.HUNG),
        (GONE, Conditions(restarting=True), False, EngineState.RESTARTING),
        (GONE, Conditions(restarting=True, failed=True), False, EngineState.FAILED),
    ],
)
def test_the_most_severe_state_wins(
    health: EngineHealth, conditions: Conditions, overdue: bool, expected: EngineState
) -> None:
    assert engine_state(health, conditions, canary_overdue=overdue) is expected


async def ready_metric(gw: InProcessGateway) -> float:
    text = (await gw.http.get("/metrics")).text
    return samples(text, "specgw_engine_ready")[()]


async def test_a_stopped_idle_engine_is_found_without_a_request() -> None:
    clock = ManualClock()
    async with serve_in_process(gateway_settings(**CANARY), clock=clock) as gw:
        watch = gw.runtime.watch
        assert watch is not None
        assert (await gw.http.get("/ready")).status_code == 200
        assert await ready_metric(gw) == 1.0
        await clock.settle()  # the start-up canary answered before the core stops
        gw.engine.wedge()
        await clock.advance(INTERVAL_S)  # the next canary goes out, and is not answered
        await clock.advance(UNANSWERED_S - 0.03)
        assert watch.state is EngineState.READY  # not before its deadline
        await clock.advance(0.03)
        assert watch.state is EngineState.HUNG
        assert await ready_metric(gw) == 0.0
        ready = await gw.http.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["detail"]["engine_state"] == "hung"
        assert "no answer to the canary for 5.0 s" in ready.json()["detail"]["engine"]
        text = (await gw.http.get("/metrics")).text
        assert samples(text, "specgw_engine_state")[(("state", "hung"),)] == 1.0
        gw.engine.resume()
        await until(lambda: watch.state is EngineState.READY, what="ready on the late answer")
        assert await ready_metric(gw) == 1.0
        assert (await gw.http.get("/ready")).status_code == 200


async def test_without_the_canary_a_stopped_idle_engine_looks_ready() -> None:
    """What the canary adds: with it off, nothing asks the stopped core anything."""
    clock = ManualClock()
    async with serve_in_process(gateway_settings(canary_interval_s=0), clock=clock) as gw:
        await clock.settle()  # the start-up canary answered before the core stops
        gw.engine.wedge()
        await clock.advance(60.0)
        assert (await gw.http.get("/ready")).status_code == 200
        assert await ready_metric(gw) == 1.0
        gw.engine.resume()


async def test_a_dead_engine_core_reads_0_until_the_supervisor_replaced_it() -> None:
    """On the real clock: the supervisor's 2 s backoff, then a fake engine starts at once."""
    async with serve_in_process(gateway_settings(**CANARY)) as gw:
        watch = gw.runtime.watch
        assert watch is not None
        seen: list[tuple[EngineState | None, float]] = []
        gw.engine.kill()

        async def replaced() -> bool:
            state = watch.state
            if state is EngineState.READY:
                return bool(seen)  # ready again after it was seen down
            ready = await ready_metric(gw)
            if watch.state is state:  # not changed while /metrics was read
                seen.append((state, ready))
            return False

        await until(replaced, 20.0, "the engine replaced")
        assert (EngineState.RESTARTING, 0.0) in seen
        assert all(ready == 0.0 for state, ready in seen if state is not EngineState.READY)
        assert await ready_metric(gw) == 1.0
        assert not gw.engine._dead  # a new engine


async def test_draining_reads_0() -> None:
    clock = ManualClock()
    async with serve_in_process(gateway_settings(**CANARY), clock=clock) as gw:
        watch = gw.runtime.watch
        assert watch is not None
        gw.runtime.begin_drain()
        await clock.settle()  # the drain pokes the watch: no tick needed
        assert watch.state is EngineState.DRAINING
        assert await ready_metric(gw) == 0.0
        assert (await gw.http.get("/ready")).status_code == 503


class ScriptedEngine:
    """An engine whose health is set by the test and whose ping waits for `answer`."""

    def __init__(self, health: EngineHealth) -> None:
        self.health_now = health
        self.answer = asyncio.Event()
        self.pings = 0
        self.error: Exception | None = None

    async def health(self) -> EngineHealth:
        return self.health_now

    async def ping(self) -> None:
        self.pings += 1
        await self.answer.wait()
        if self.error is not None:
            raise self.error


def watch_on(
    engine: ScriptedEngine, clock: ManualClock, published: list[EngineState] | None = None
) -> EngineWatch:
    publish = published.append if published is not None else lambda _: None
    return EngineWatch(
        lambda: engine,
        Conditions,
        publish,
        interval_s=INTERVAL_S,
        timeout_s=TIMEOUT_S,
        clock=clock,
    )


async def test_busy_engine_gets_no_canary_and_one_canary_is_in_flight_at_a_time() -> None:
    """Work in flight that produced output recently: the stall bound judges, no canary
    queues behind a long step. Idle: one canary per period, never two at once."""
    clock = ManualClock()
    engine = ScriptedEngine(EngineHealth(alive=True, ready=True, stalled_for_s=0.02))
    published: list[EngineState] = []
    watch = watch_on(engine, clock, published)
    for _ in range(5):
        await watch.check()
        await clock.advance(INTERVAL_S + 0.1)
    assert engine.pings == 0
    engine.health_now = UP
    for _ in range(5):
        await watch.check()
        await clock.advance(INTERVAL_S + 0.1)
    assert engine.pings == 1  # unanswered: no second one
    assert published == [EngineState.READY, EngineState.HUNG]
    engine.answer.set()
    await clock.settle()
    state, _ = await watch.check()
    assert state is EngineState.READY
    await watch.close()


async def test_the_watch_publishes_hung_as_the_deadline_passes_on_its_own() -> None:
    """No request and nobody asking: the watch's own loop sends the canary and turns
    hung just after the canary's deadline, then ready on the late answer."""
    clock = ManualClock()
    engine = ScriptedEngine(UP)
    published: list[EngineState] = []
    watch = watch_on(engine, clock, published)
    watch.start()
    await clock.advance(TIMEOUT_S)
    assert (engine.pings, published) == (1, [EngineState.READY])
    await clock.advance(0.02)
    assert published == [EngineState.READY, EngineState.HUNG]
    await clock.advance(10.0)
    assert watch.hung_for_s() == pytest.approx(10.0, abs=0.02)
    assert engine.pings == 1  # still one in flight
    engine.answer.set()
    await clock.settle()
    assert published[-1] is EngineState.READY
    assert watch.hung_for_s() == 0.0
    assert engine.pings == 2  # the last one went out over a period ago: the next at once
    await clock.advance(INTERVAL_S - 0.01)
    assert engine.pings == 2
    await clock.advance(0.01)
    assert engine.pings == 3  # then one per period
    await watch.close()


async def test_with_the_canary_off_nothing_asks_a_stopped_engine() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(UP)
    published: list[EngineState] = []
    watch = EngineWatch(
        lambda: engine, Conditions, published.append, interval_s=0, timeout_s=5, clock=clock
    )
    watch.start()
    await clock.advance(60.0)
    assert (engine.pings, published) == (0, [EngineState.READY])
    await watch.close()


async def test_a_canary_that_fails_marks_the_engine_hung_until_one_succeeds() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(UP)
    engine.answer.set()
    engine.error = RuntimeError("worker check_health failed")
    watch = watch_on(engine, clock)
    await watch.check()
    await clock.settle()
    state, health = await watch.check()
    assert state is EngineState.HUNG
    assert "worker check_health failed" in watch.describe(state, health)
    engine.error = None
    await clock.advance(INTERVAL_S)
    await watch.check()  # sends the next canary
    await clock.settle()
    state, _ = await watch.check()
    assert state is EngineState.READY
    await watch.close()


async def test_a_dead_engines_canary_error_does_not_hide_that_it_is_dead() -> None:
    clock = ManualClock()
    engine = ScriptedEngine(UP)
    engine.answer.set()
    engine.error = EngineDeadError("gone")
    watch = watch_on(engine, clock)
    await watch.check()
    await clock.settle()
    engine.health_now = GONE
    state, _ = await watch.check()
    assert state is EngineState.DEAD
    await watch.close()


async def test_a_canary_to_a_replaced_engine_is_dropped() -> None:
    """The supervisor swapped engines while a canary waited on the old one."""
    clock = ManualClock()
    old, new = ScriptedEngine(UP), ScriptedEngine(UP)
    current = [old]
    watch = EngineWatch(
        lambda: current[0],
        Conditions,
        lambda _: None,
        interval_s=INTERVAL_S,
        timeout_s=TIMEOUT_S,
        clock=clock,
    )
    await watch.check()
    await clock.settle()  # the canary task starts
    assert old.pings == 1
    current[0] = new
    state, _ = await watch.check()  # the old canary is cancelled, a new one sent
    await clock.settle()
    assert state is EngineState.READY
    assert new.pings == 1
    new.answer.set()
    await clock.advance(TIMEOUT_S + 1.0)  # past the old canary's deadline
    state, _ = await watch.check()
    assert state is EngineState.READY
    await watch.close()


async def test_an_engine_hung_past_the_bound_fails_liveness() -> None:
    """Hung: /ready 503 at once; /health only once hung for `liveness_hung_s` without a
    break (the orchestrator then restarts the replica), and 200 again once it answers."""
    clock = ManualClock()
    settings = gateway_settings(**CANARY, liveness_hung_s=30.0)
    async with serve_in_process(settings, clock=clock) as gw:
        watch = gw.runtime.watch
        assert watch is not None
        await clock.settle()  # the start-up canary answered before the core stops
        gw.engine.wedge()
        await clock.advance(INTERVAL_S + UNANSWERED_S)
        assert watch.state is EngineState.HUNG
        early = await gw.http.get("/health")
        assert early.status_code == 200, early.json()
        assert (await gw.http.get("/ready")).status_code == 503
        await clock.advance(29.9)
        assert (await gw.http.get("/health")).status_code == 200
        await clock.advance(0.1)
        late = await gw.http.get("/health")
        assert late.status_code == 503
        assert late.json()["status"] == "hung"
        assert "no answer to the canary" in late.json()["detail"]
        gw.engine.resume()
        await until(lambda: watch.state is EngineState.READY, what="ready on the late answer")
        assert watch.hung_for_s() == 0.0
        assert (await gw.http.get("/health")).json() == {"status": "ok", "phase": "ready"}


async def test_with_the_bound_off_a_hung_engine_stays_live() -> None:
    clock = ManualClock()
    settings = gateway_settings(**CANARY, liveness_hung_s=0)
    async with serve_in_process(settings, clock=clock) as gw:
        watch = gw.runtime.watch
        assert watch is not None
        await clock.settle()  # the start-up canary answered before the core stops
        gw.engine.wedge()
        await clock.advance(INTERVAL_S + UNANSWERED_S)
        assert watch.state is EngineState.HUNG
        await clock.advance(600.0)
        assert watch.hung_for_s() >= 600.0
        assert (await gw.http.get("/health")).status_code == 200
        gw.engine.resume()
        await until(lambda: watch.state is EngineState.READY, what="ready on the late answer")
