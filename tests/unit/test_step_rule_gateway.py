"""The step rule through the whole gateway on the fake backend: with `step_rule` on, a
request sends its class's vote and the step costs, k becomes a bound, and the engine
sets the depth (the fake: the rule's depth for the class alone). `tests/engine/
test_vllm_engine.py` runs the vLLM scheduler's side on the real engine."""

from __future__ import annotations

import pytest

from engine.fake import AcceptanceScript, FakeEngineConfig
from gateway.control.settings import ControllerSettings
from tests.unit.conftest import MODEL, serve_in_process

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: Latencies as the step model prices them: the cost model learns each depth's price from
#: requests of a few 2 ms steps, where one scheduling stall on a loaded host makes k = 0
#: dearer than k = 1 and a never-accepted class then drafts.
SCRIPTED = FakeEngineConfig(
    scripts=(
        AcceptanceScript("[easy]", (0.95, 0.95, 0.95, 0.95)),
        AcceptanceScript("[hard]", (0.0, 0.0, 0.0, 0.0)),
    ),
    modelled_latency=True,
)


@pytest.mark.parametrize("step_rule", [True, False])
async def test_the_engine_runs_a_never_accepted_class_at_zero_from_its_vote(
    step_rule: bool,
) -> None:
    # No probes: one alone in its step runs at its own depth, by design (`vote_step_depth`).
    controller = ControllerSettings(
        calibrate_batches=[],
        step_rule="on" if step_rule else "off",
        min_samples=4,
        exploration_share=0.0,
        cost_probe_share=0.0,
        zero_probe_share=0.0,
    )
    async with serve_in_process(controller=controller, engine=SCRIPTED) as gw:
        client = gw.client()
        for i in range(16):
            await client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"[easy] question {i}"}],
                max_tokens=16,
                temperature=0,
            )
            await client.completions.create(
                model=MODEL, prompt=f"[hard] prose {i} about rivers", max_tokens=16, temperature=0
            )
        ran = [o.speculation.k for o in gw.engine.outcomes]
    easy, hard = ran[0::2], ran[1::2]
    assert max(easy[-4:]) > 0, easy
    if step_rule:
        # The vote of a class whose drafts are never accepted: no depth pays (the guard).
        assert hard[-4:] == [0] * 4, hard
        assert all(k <= controller.max_k for k in ran)
    else:
        assert hard[-4:] == [0] * 4, hard  # the per-request policy gets there too
