"""Fair shares between keys in admission: table tests on the `Admission` object.

Deterministic: requests are tasks that block in `acquire`; the test frees slots
one at a time and records which key each freed slot went to (no sleeps).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import pytest

from gateway.admission import Admission
from gateway.clock import ManualClock
from gateway.errors import ErrorKind, GatewayError

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Harness:
    """Requests as tasks, slots freed one by one, the grant order recorded."""

    def __init__(self, admission: Admission) -> None:
        self.admission = admission
        self.granted: list[str] = []
        self.refused: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []

    async def submit(self, key: str, n: int = 1, cls: str = "chat") -> None:
        for _ in range(n):
            self.tasks.append(asyncio.ensure_future(self._request(key, cls)))
        await settle()

    async def _request(self, key: str, cls: str) -> None:
        try:
            await self.admission.acquire(cls, key)
        except GatewayError:
            self.refused.append(key)
            raise
        self.granted.append(key)

    async def finish(self, key: str) -> str:
        """One running request of `key` ends; returns the key its slot went to ("" if none)."""
        before = len(self.granted)
        self.admission.release(key)
        await settle()
        return self.granted[before] if len(self.granted) > before else ""

    def running(self) -> Counter[str]:
        return Counter({k: r for k, (r, _) in self.admission.load_by_key().items()})


async def settle() -> None:
    """Let every task that can run, run (a grant or a refusal takes a few loop turns)."""
    for _ in range(10):
        await asyncio.sleep(0)


@pytest.fixture
async def harnesses() -> AsyncIterator[list[Harness]]:
    """Harnesses made by a test; their blocked requests are cancelled afterwards."""
    made: list[Harness] = []
    yield made
    tasks = [t for h in made for t in h.tasks]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def weights(table: dict[str, float]) -> Admission:
    return Admission(8, 200, 30, weight_of=lambda key: table.get(key, 1.0))


async def test_a_waiting_key_gets_every_freed_slot_until_its_share(
    harnesses: list[Harness],
) -> None:
    """A floods (8 running, 92 queued), B sends 10: B's first 4 (8 / 2) requests are
    admitted at the first 4 releases, then the keys alternate at 4 + 4."""
    h = Harness(weights({}))
    harnesses.append(h)
    await h.submit("A", 100)
    await h.submit("B", 10)
    assert h.running() == Counter(A=8)
    order = [await h.finish("A") for _ in range(4)]
    assert order == ["B", "B", "B", "B"]
    assert h.running() == Counter(A=4, B=4)
    # At its share B's next request waits for one of B's own to end; A keeps its 4.
    assert await h.finish("A") == "A"
    assert await h.finish("B") == "B"
    assert h.running() == Counter(A=4, B=4)


@pytest.mark.parametrize(
    ("table", "share_b"),
    [({"A": 1, "B": 1}, 4), ({"A": 1, "B": 3}, 6), ({"A": 3, "B": 1}, 2), ({"A": 7, "B": 1}, 1)],
)
async def test_weighted_shares_of_eight_slots(
    table: dict[str, float], share_b: int, harnesses: list[Harness]
) -> None:
    h = Harness(weights(table))
    harnesses.append(h)
    await h.submit("A", 50)
    await h.submit("B", 50)
    for _ in range(40):  # long enough for the shares to settle; A and B end in turn
        for key in ("A", "B"):
            if h.running()[key]:
                await h.finish(key)
    assert h.running()["B"] == share_b
    assert h.running()["A"] == 8 - share_b


async def test_a_lone_key_may_use_every_slot(harnesses: list[Harness]) -> None:
    h = Harness(weights({"A": 1, "B": 100}))
    harnesses.append(h)
    await h.submit("A", 12)
    assert h.running() == Counter(A=8)
    assert await h.finish("A") == "A"  # nobody else waits: work-conserving


async def test_classes_of_one_key_still_rotate(harnesses: list[Harness]) -> None:
    admission = Admission(1, 10, 30)
    h = Harness(admission)
    harnesses.append(h)
    await h.submit("A", 1, cls="long")
    await h.submit("A", 4, cls="long")
    await h.submit("A", 1, cls="short")
    order = [await h.finish("A") for _ in range(2)]
    assert order == ["A", "A"]
    queued_classes = list(admission._keys["A"].classes)
    assert queued_classes == ["long"]  # "short" was served second, not fifth


async def test_a_full_queue_pushes_out_the_flooding_keys_newest_waiter(
    harnesses: list[Harness],
) -> None:
    admission = Admission(1, 4, 30)
    h = Harness(admission)
    harnesses.append(h)
    await h.submit("A", 5)  # 1 running, 4 queued: the queue is full
    await h.submit("B", 1)  # pushes out A's newest
    assert h.refused == ["A"]
    await h.submit("B", 1)  # A 3 queued vs B 1 + 1: again
    assert h.refused == ["A", "A"]
    await h.submit("B", 1)  # A 2 vs B 2 + 1: B is at its share; B is shed
    assert h.refused == ["A", "A", "B"]
    assert admission.queued == 4
    # Two queued each: the freed slot goes to the key waiting longest, then to the other.
    assert [await h.finish("A"), await h.finish("A")] == ["A", "B"]


async def test_a_pushed_out_waiter_gets_a_429_with_retry_after() -> None:
    admission = Admission(1, 2, 30)
    await admission.acquire("c", "A")
    first = asyncio.ensure_future(admission.acquire("c", "A"))
    waiting = asyncio.ensure_future(admission.acquire("c", "A"))
    await settle()
    newcomer = asyncio.ensure_future(admission.acquire("c", "B"))
    await settle()
    with pytest.raises(GatewayError) as caught:
        await waiting
    assert caught.value.kind is ErrorKind.OVERLOADED
    assert caught.value.response_headers()["retry-after"] == "1"
    admission.release("A")
    await settle()
    assert admission.queued == 1
    await first
    admission.release("A")  # B's turn: A ran 1, B 0
    await newcomer
    assert admission.load_by_key() == {"B": (1, 0)}


def test_edge_tickets_keep_a_share_for_other_keys() -> None:
    admission = Admission(2, 2, 30)  # 4 tickets
    for _ in range(4):
        admission.enter("A")
    with pytest.raises(GatewayError):
        admission.enter("A")
    admission.enter("B")  # B's share of 4 among A and B is 2
    admission.enter("B")
    with pytest.raises(GatewayError):
        admission.enter("B")
    assert admission.inside == 6
    for key in ("A", "A", "A", "A", "B", "B"):
        admission.leave(key)
    assert admission.inside == 0
    assert admission.load_by_key() == {}


async def test_no_state_is_left_behind() -> None:
    """Timeouts, cancellations and releases leave no per-key records (bounded memory)."""
    clock = ManualClock()
    admission = Admission(1, 10, 30, clock=clock)
    await admission.acquire("c", "A")
    timed_out = asyncio.ensure_future(admission.acquire("c", "B"))
    await clock.advance(30)
    assert timed_out.done()
    with pytest.raises(GatewayError):
        await timed_out
    cancelled = asyncio.ensure_future(admission.acquire("c", "C"))
    await settle()
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    admission.release("A")
    assert admission.load_by_key() == {}
    assert (admission.running, admission.queued) == (0, 0)
