"""The controller through the whole gateway: classes whose drafts are accepted at different
rates end at different depths (the fake engine's acceptance is scripted per prompt marker;
`tests/gateway/test_adaptive_classes.py` is the same on the real engine and model)."""

from __future__ import annotations

import statistics

import pytest

from engine.fake import AcceptanceScript, FakeEngineConfig
from tests.unit.conftest import MODEL, serve_in_process

pytestmark = pytest.mark.asyncio(loop_scope="session")

SCRIPTED = FakeEngineConfig(
    scripts=(
        AcceptanceScript("[easy]", (0.95, 0.95, 0.95, 0.95)),
        AcceptanceScript("[hard]", (0.0, 0.0, 0.0, 0.0)),
    ),
    # The costs the controller learns are the steps' modelled times, not the host's: a
    # loaded host's scheduling stalls would price the depths at random.
    modelled_latency=True,
)


async def test_classes_end_at_the_depths_their_acceptance_pays_for() -> None:
    easy: list[int] = []
    hard: list[int] = []
    async with serve_in_process(engine=SCRIPTED) as gw:
        client = gw.client()
        for i in range(24):
            chat = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"[easy] question {i}"}],
                max_tokens=24,
                temperature=0,
            )
            easy.append(int(chat.headers["x-specgw-k"]))
            completion = await client.completions.with_raw_response.create(
                model=MODEL, prompt=f"[hard] prose {i} about rivers", max_tokens=24, temperature=0
            )
            hard.append(int(completion.headers["x-specgw-k"]))
        classes = {row["label"] for row in gw.runtime.class_report()}
    assert len(classes) == 2, classes
    # The last eight of each: the controller's choice, give or take an exploration probe.
    # Among the deep depths, whose goodputs differ by some 10 %, it may settle on any;
    # a draft that is never accepted never pays.
    assert statistics.median(easy[-8:]) >= 2, easy
    assert statistics.median(hard[-8:]) == 0, hard
