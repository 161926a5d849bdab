"""Admission control: bounded running set, immediate shedding, per-class fairness, drain.

Time is a `ManualClock`: a queue timeout or a drain deadline passes when the test
advances it, and "at once" means without the clock moving at all.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import Admission
from gateway.clock import ManualClock
from gateway.errors import ErrorKind, GatewayError


async def test_full_queue_sheds_at_once_with_retry_after() -> None:
    clock = ManualClock()
    admission = Admission(max_running=1, max_queued=1, queue_timeout_s=10, clock=clock)
    await admission.acquire("a")
    waiter = asyncio.ensure_future(admission.acquire("a"))
    shed = asyncio.ensure_future(admission.acquire("a"))
    await clock.settle()
    assert shed.done()
    assert not waiter.done()
    with pytest.raises(GatewayError) as caught:
        await shed
    assert caught.value.kind is ErrorKind.OVERLOADED
    assert caught.value.response_headers()["retry-after"] == "1"
    admission.release()
    await waiter
    assert admission.running == 1


async def test_queue_timeout_is_a_429() -> None:
    clock = ManualClock()
    admission = Admission(max_running=1, max_queued=4, queue_timeout_s=30, clock=clock)
    await admission.acquire("a")
    waiter = asyncio.ensure_future(admission.acquire("b"))
    await clock.advance(29.9)
    assert not waiter.done()
    assert admission.queued == 1
    await clock.advance(0.1)
    assert waiter.done()
    with pytest.raises(GatewayError) as caught:
        await waiter
    assert caught.value.status == 429
    assert admission.queued == 0
    assert clock.pending == 0  # the timer of a finished wait is gone


async def test_a_grant_before_the_timeout_ends_the_wait_and_its_timer() -> None:
    clock = ManualClock()
    admission = Admission(max_running=1, max_queued=4, queue_timeout_s=30, clock=clock)
    await admission.acquire("a")
    waiter = asyncio.ensure_future(admission.acquire("b"))
    await clock.advance(10)
    admission.release()
    await clock.settle()
    assert waiter.done()
    assert waiter.exception() is None
    assert clock.pending == 0
    await clock.advance(60)  # the old deadline passes: nothing fires
    assert admission.running == 1


async def test_freed_slots_rotate_across_classes() -> None:
    admission = Admission(max_running=1, max_queued=10, queue_timeout_s=10)
    await admission.acquire("hog")
    order: list[str] = []

    async def request(cls: str) -> None:
        await admission.acquire(cls)
        order.append(cls)

    tasks = [asyncio.ensure_future(request("hog")) for _ in range(4)]
    await asyncio.sleep(0)
    tasks.append(asyncio.ensure_future(request("small")))
    await asyncio.sleep(0)
    for _ in range(5):
        admission.release()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    # "small" arrived after four "hog" requests but is served second, not fifth.
    assert order.index("small") <= 1


async def test_drain_refuses_new_and_waits_for_running() -> None:
    clock = ManualClock()
    admission = Admission(max_running=2, max_queued=2, queue_timeout_s=10, clock=clock)
    await admission.acquire("a")
    drain = asyncio.ensure_future(admission.drain(timeout_s=5))
    await clock.advance(4.9)
    with pytest.raises(GatewayError) as caught:
        await admission.acquire("a")
    assert caught.value.kind is ErrorKind.DRAINING
    assert caught.value.status == 503
    assert not drain.done()
    admission.release()
    assert await drain is True


async def test_a_drain_past_its_deadline_reports_false() -> None:
    clock = ManualClock()
    admission = Admission(max_running=2, max_queued=2, queue_timeout_s=10, clock=clock)
    await admission.acquire("a")
    drain = asyncio.ensure_future(admission.drain(timeout_s=5))
    await clock.advance(5)
    assert drain.done()
    assert drain.result() is False
    assert admission.running == 1  # still running: the caller decides what comes next


async def test_cancelled_waiter_leaves_no_slot_behind() -> None:
    admission = Admission(max_running=1, max_queued=2, queue_timeout_s=10)
    await admission.acquire("a")
    waiter = asyncio.ensure_future(admission.acquire("a"))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.queued == 0
    admission.release()
    assert admission.running == 0
