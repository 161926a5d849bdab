"""Time to first token from arrival at the gateway, and the admission wait, in process.

With one running slot and two requests at once, the second waits for the first: its
wait shows in `specgw_admission_wait_seconds` and in the gateway's TTFT, never in the
engine's own `specgw_time_to_first_token_seconds`.
"""

from __future__ import annotations

import asyncio

import pytest

from engine.fake import FakeEngineConfig, StepTimeModel
from tests.unit.conftest import MESSAGES, MODEL, gateway_settings, serve_in_process
from tests.unit.test_ops import samples

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: 20 ms per engine step: a 10-token reply takes several steps.
SLOW_STEPS = FakeEngineConfig(step_time=StepTimeModel(base_s=0.02, per_draft_s=0.0, per_seq_s=0.0))


def total(exposition: str, name: str) -> float:
    return sum(samples(exposition, name).values())


async def test_the_admission_wait_is_in_the_gateways_ttft_not_the_engines() -> None:
    settings = gateway_settings(max_running=1, max_queued=4)
    async with serve_in_process(settings, engine=SLOW_STEPS) as gw:
        client = gw.client()
        replies = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model=MODEL,
                    messages=MESSAGES,  # type: ignore[arg-type]
                    max_tokens=10,
                    temperature=0,
                )
                for _ in range(2)
            )
        )
        assert all(r.choices[0].finish_reason == "length" for r in replies)
        text = (await gw.http.get("/metrics")).text
    assert total(text, "specgw_admission_wait_seconds_count") == 2
    waited = total(text, "specgw_admission_wait_seconds_sum")
    engine_ttft = total(text, "specgw_time_to_first_token_seconds_sum")
    gateway_ttft = total(text, "specgw_gateway_time_to_first_token_seconds_sum")
    assert total(text, "specgw_gateway_time_to_first_token_seconds_count") == 2
    # The second request waited for the first one's whole reply: at least its prefill and
    # one decode step (load only lengthens them), and no longer than both replies took.
    # (A share of the two e2e's was too tight: under load the second reply alone ran 2x.)
    engine_e2e = total(text, "specgw_request_duration_seconds_sum")
    assert 2 * SLOW_STEPS.step_time.base_s <= waited < engine_e2e
    assert engine_ttft < waited
    assert gateway_ttft >= engine_ttft + waited


async def test_a_request_admitted_at_once_waits_about_nothing() -> None:
    async with serve_in_process() as gw:
        await gw.client().completions.create(model=MODEL, prompt="Count to three:", max_tokens=4)
        text = (await gw.http.get("/metrics")).text
    assert total(text, "specgw_admission_wait_seconds_count") == 1
    assert total(text, "specgw_admission_wait_seconds_sum") < 0.05
    gateway_ttft = total(text, "specgw_gateway_time_to_first_token_seconds_sum")
    assert gateway_ttft >= total(text, "specgw_time_to_first_token_seconds_sum") > 0
