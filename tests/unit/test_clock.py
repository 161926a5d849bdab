"""The clock seam: `sleep`, `timeout` and `wait_for` keep asyncio's semantics on any
clock, and `ManualClock` fires each timer at its own time, in deadline order."""

from __future__ import annotations

import asyncio

import pytest

from gateway.clock import MONOTONIC, ManualClock, sleep, timeout, wait_for

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_timers_fire_in_deadline_order_each_at_its_own_time() -> None:
    clock = ManualClock(start=0.0)
    fired: list[tuple[str, float]] = []
    for name, delay in (("c", 3.0), ("a", 1.0), ("b", 2.0), ("late", 9.0)):
        clock.call_later(delay, lambda name=name: fired.append((name, clock.now())))
    await clock.advance(5.0)
    assert fired == [("a", 1.0), ("b", 2.0), ("c", 3.0)]
    assert clock.now() == 5.0
    assert clock.next_due_s() == 4.0


async def test_a_cancelled_timer_never_fires() -> None:
    clock = ManualClock()
    fired: list[int] = []
    clock.call_later(1.0, lambda: fired.append(1)).cancel()
    await clock.advance(2.0)
    assert fired == []
    assert clock.pending == 0


async def test_what_a_timer_wakes_runs_before_the_next_timer() -> None:
    """Two sleepers: the first one's follow-up (a new 1 s sleep) is armed at its wake-up
    time, so it lands before the second sleeper's deadline."""
    clock = ManualClock(start=0.0)
    log: list[tuple[str, float]] = []

    async def sleeper(name: str, first: float, then: float) -> None:
        await sleep(clock, first)
        log.append((name, clock.now()))
        await sleep(clock, then)
        log.append((name, clock.now()))

    tasks = [
        asyncio.ensure_future(sleeper("a", 1.0, 1.0)),
        asyncio.ensure_future(sleeper("b", 2.5, 1.0)),
    ]
    await clock.advance(4.0)
    await asyncio.gather(*tasks)
    assert log == [("a", 1.0), ("a", 2.0), ("b", 2.5), ("b", 3.5)]


async def test_sleep_waits_for_the_clock_not_the_wall() -> None:
    clock = ManualClock()
    task = asyncio.ensure_future(sleep(clock, 60.0))
    await clock.advance(59.0)
    assert not task.done()
    await clock.advance(1.0)
    assert task.done()


async def test_wait_for_times_out_at_the_deadline_and_cancels_the_wait() -> None:
    clock = ManualClock()
    event = asyncio.Event()
    task = asyncio.ensure_future(wait_for(clock, event.wait(), 5.0))
    await clock.advance(4.99)
    assert not task.done()
    await clock.advance(0.01)
    assert task.done()
    with pytest.raises(TimeoutError):
        task.result()
    assert clock.pending == 0


async def test_wait_for_returns_the_result_and_disarms_its_timer() -> None:
    clock = ManualClock()
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(wait_for(clock, future, 5.0))
    await clock.settle()
    future.set_result(7)
    assert await task == 7
    assert clock.pending == 0


async def test_a_cancellation_from_outside_is_not_a_timeout() -> None:
    """Cancelled by someone else after the deadline fired: CancelledError, as asyncio's."""
    clock = ManualClock()

    async def waits() -> None:
        async with timeout(clock, 1.0) as scope:
            try:
                await asyncio.Event().wait()
            finally:
                assert scope.expired
                asyncio.current_task().cancel()  # type: ignore[union-attr]
                await asyncio.sleep(0)

    task = asyncio.ensure_future(waits())
    await clock.advance(1.0)
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_plain_cancellation_passes_through() -> None:
    clock = ManualClock()
    task = asyncio.ensure_future(wait_for(clock, asyncio.Event().wait(), 5.0))
    await clock.settle()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert clock.pending == 0


async def test_the_real_clock_times_out_without_a_wait() -> None:
    """`MONOTONIC` on the running loop: a zero deadline passes on the next loop turn."""
    before = MONOTONIC.now()
    with pytest.raises(TimeoutError):
        await wait_for(MONOTONIC, asyncio.Event().wait(), 0)
    assert MONOTONIC.now() >= before
    assert await wait_for(MONOTONIC, asyncio.sleep(0, result=3), 60) == 3
