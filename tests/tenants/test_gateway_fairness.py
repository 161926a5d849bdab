"""Fair shares between keys through the whole gateway and the official `openai` client.

Key A floods 100 concurrent streams of one class into 8 running slots; key B then
sends 10 of the same class. With equal weights B's share is 4 slots, so (see
`gateway.admission`) B's first 4 requests are admitted at the first 4 releases,
each later one as soon as one of B's own ends: all 10 end within about 4 service
times, in which A's requests end at most 8 running + 4 per service time (about 20).
First come, first served would make B wait behind A's 92 queued requests: all 100
of A's would end first.

Time is counted in A's ends, not in seconds: on a loaded host a wall-clock share
of the run moves with the scheduler, and B's requests, sent through the client
while A's run, would reach the queue after some of A's queued ones were already
admitted. So the engine is held between steps (`FakeEngine.wedge`) from before the
flood until all of B's requests wait in the queue: the race starts at release.
"""

from __future__ import annotations

import asyncio

import pytest

from engine.fake import FakeEngineConfig, StepTimeModel
from tests.clock import until
from tests.tenants.limits import KEY_A, KEY_B, MESSAGES
from tests.tenants.test_gateway_limits import settings
from tests.unit.conftest import MODEL, InProcessGateway, serve_in_process

pytestmark = pytest.mark.asyncio(loop_scope="session")

SLOTS = 8


async def stream(gw: InProcessGateway, key: str, ends: list[str]) -> None:
    """One stream read to its end; records its key in the order of ends."""
    chunks = await gw.client(key, max_retries=0).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=12, temperature=0, stream=True
    )
    async for _ in chunks:
        pass
    ends.append(key)


async def test_a_flood_from_one_key_leaves_the_other_its_share() -> None:
    engine = FakeEngineConfig(step_time=StepTimeModel(base_s=0.03, per_draft_s=0, per_seq_s=0))
    config = settings({}, max_running=SLOTS, max_queued=200)
    async with serve_in_process(config, engine=engine) as gw:
        admission = gw.runtime.admission
        ends: list[str] = []
        gw.engine.wedge()  # nothing ends, so nothing is admitted, until B waits too
        flood = [asyncio.ensure_future(stream(gw, KEY_A, ends)) for _ in range(100)]
        await until(lambda: admission.running == SLOTS and admission.queued == 100 - SLOTS)
        trickle = [asyncio.ensure_future(stream(gw, KEY_B, ends)) for _ in range(10)]
        await until(lambda: admission.queued == 100 - SLOTS + 10)
        assert not ends
        gw.engine.resume()
        await asyncio.gather(*flood, *trickle)
    b_last = max(i for i, key in enumerate(ends) if key == KEY_B)
    a_before_b_done = ends[:b_last].count(KEY_A)
    # Bound: about 20 (measured 16-19 on 2 cores beside four busy loops), with room for
    # the requests' random lengths; first come, first served ends all 100 of A's first
    # (measured with the oldest waiter served first: 100).
    assert a_before_b_done <= 40, (a_before_b_done, ends)
