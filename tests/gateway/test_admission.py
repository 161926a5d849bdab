"""Admission control: bounded running set, immediate shedding, per-class fairness, drain."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.admission import Admission
from gateway.errors import ErrorKind, GatewayError


async def test_full_queue_sheds_at_once_with_retry_after() -> None:
    admission = Admission(max_running=1, max_queued=1, queue_timeout_s=10)
    await admission.acquire("a")
    waiter = asyncio.ensure_future(admission.acquire("a"))
    await asyncio.sleep(0)
    started = time.monotonic()
    with pytest.raises(GatewayError) as caught:
        await admission.acquire("a")
    assert time.monotonic() - started < 0.05
    assert caught.value.kind is ErrorKind.OVERLOADED
    assert caught.value.response_headers()["retry-after"] == "1"
    admission.release()
    await waiter
    assert admission.running == 1


async def test_queue_timeout_is_a_429() -> None:
    admission = Admission(max_running=1, max_queued=4, queue_timeout_s=0.05)
    await admission.acquire("a")
    with pytest.raises(GatewayError) as caught:
        await admission.acquire("b")
    assert caught.value.status == 429
    assert admission.queued == 0


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
    admission = Admission(max_running=2, max_queued=2, queue_timeout_s=10)
    await admission.acquire("a")
    drain = asyncio.ensure_future(admission.drain(timeout_s=5))
    await asyncio.sleep(0)
    with pytest.raises(GatewayError) as caught:
        await admission.acquire("a")
    assert caught.value.kind is ErrorKind.DRAINING
    assert caught.value.status == 503
    assert not drain.done()
    admission.release()
    assert await drain is True


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
