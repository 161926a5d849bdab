"""The cold-prefill price from start-up calibration: fastest runs, not one pair's luck."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator

import pytest

from engine.interface import GenerateRequest, GenerationChunk, RequestOutcome, SpeculationOutcome
from gateway.calibration import PREFILL_PAIRS, _calibrate_prefill
from gateway.control.cost_model import CostModel
from gateway.runtime import freeze_startup_heap


class TimedPrompts:
    """Answers each request with an outcome whose time to the first token is scripted,
    in order, by prompt kind (the short calibration prompt or a cold one)."""

    def __init__(self, short: list[float], cold: list[float], short_tokens: int = 24) -> None:
        self.times = {"short": list(short), "cold": list(cold)}
        self.short_tokens = short_tokens
        self.prompts: list[str] = []

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        kind = "cold" if "-cold-" in request.request_id else "short"
        self.prompts.append(request.prompt if isinstance(request.prompt, str) else "")
        tokens = self.short_tokens if kind == "short" else 220
        outcome = RequestOutcome(
            request_id=request.request_id,
            prompt_tokens=tokens,
            output_tokens=2,
            finish_reason="length",
            speculation=SpeculationOutcome(k=0),
            ttft_s=self.times[kind].pop(0),
            cached_prompt_tokens=16 if kind == "short" else 0,
        )
        yield GenerationChunk(request.request_id, "", (), True, "length", outcome)


def _priced(engine: TimedPrompts) -> float:
    cost = CostModel(3, 0.02, 0.08, 16.0, 2.0, 0.01)
    asyncio.run(_calibrate_prefill(engine, cost, 1.0))  # type: ignore[arg-type]
    return cost.prefill_s


def test_a_stalled_pair_does_not_decide_the_price() -> None:
    # The first pair's short request was held up (40 ms) and its cold one was not: that
    # pair alone reads a negative price. The fastest of each: (30 - 10) ms over 212 tokens.
    engine = TimedPrompts(short=[0.040, 0.010, 0.011], cold=[0.031, 0.030, 0.032])
    assert _priced(engine) == pytest.approx(0.020 / (220 - 8))
    cold = [p for p in engine.prompts if p.startswith("Calibration")]
    assert len(cold) == PREFILL_PAIRS
    assert len(set(cold)) == PREFILL_PAIRS  # each one cold


def test_no_price_when_the_cold_prompt_never_reads_slower() -> None:
    engine = TimedPrompts(short=[0.010] * 3, cold=[0.010, 0.012, 0.011])
    assert _priced(engine) == 0.0


def test_no_price_when_the_prompts_barely_differ() -> None:
    engine = TimedPrompts(short=[0.010] * 3, cold=[0.030] * 3, short_tokens=210)
    assert _priced(engine) == 0.0  # 26 more fresh tokens: below the 32 the price needs


def test_the_start_up_heap_is_frozen_out_of_the_collector() -> None:
    before = gc.get_freeze_count()
    garbage = [object() for _ in range(1000)]
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() >= before + len(garbage)
    finally:
        gc.unfreeze()
