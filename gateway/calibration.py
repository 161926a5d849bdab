"""Measure the engine's step time at every depth before the gateway takes traffic.

The goodput policy divides a class's expected tokens per step by the relative cost
of a step at depth k. The cost model learns that cost online from finished
requests, starting from a prior (`prior_k_cost`, 8 % of a step per drafted token)
that suits a GPU, where verification is nearly free. Elsewhere the prior can be far
off: on this repository's 2-core CPU one drafted token costs most of a step (the
drafter's forward pass is as dear as the target's), so until traffic has measured
every depth at every load the controller keeps speculating where it does not pay,
or spends real requests on probes (`cost_probe_share`). A few seconds of synthetic
greedy requests at start-up, every k at a few batch sizes, give it measured costs
from the first request on; traffic refines them as before. The same requests
measure the time to the first token at each depth (`CostModel.first_token`).
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from engine.interface import Engine, GenerateRequest, RequestOutcome
from gateway.control.cost_model import CostModel, step_seconds

log = logging.getLogger("specgw.calibration")

#: Plain prose: every depth drafts the same text, so the runs differ only in k.
PROMPT = (
    "Write a short paragraph about how rivers shape the valleys they run through, "
    "and why their courses change over time."
)


@dataclass(frozen=True, slots=True)
class CalibrationPoint:
    """Median measured seconds of one decode step, and to the first token, at depth k
    and batch size `batch`."""

    k: int
    batch: int
    step_ms: float
    samples: int
    ttft_ms: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


async def _one(engine: Engine, request_id: str, k: int, tokens: int) -> RequestOutcome | None:
    request = GenerateRequest(
        request_id=request_id, prompt=PROMPT, max_tokens=tokens, ignore_eos=True, k=k
    )
    outcome = None
    async for chunk in engine.generate(request):
        if chunk.outcome is not None:
            outcome = chunk.outcome
    return outcome


async def calibrate(
    engine: Engine,
    cost: CostModel,
    batches: Sequence[int],
    tokens: int,
    samples: int,
) -> list[CalibrationPoint]:
    """Feed `cost` at least `samples` step times per depth 0..K at each batch size.

    A batch of b requests runs concurrently (all at the same k), so each round gives b
    samples at bucket b; rounds repeat until `samples` are in.
    """
    points: list[CalibrationPoint] = []
    started = time.monotonic()
    for batch in batches:
        rounds = max(1, math.ceil(samples / batch))
        for k in range(engine.max_depth + 1):
            seconds: list[float] = []
            firsts: list[float] = []
            for r in range(rounds):
                outcomes = await asyncio.gather(
                    *(
                        _one(engine, f"specgw-calibrate-b{batch}-k{k}-{r}-{i}", k, tokens)
                        for i in range(batch)
                    )
                )
                for outcome in outcomes:
                    if outcome is None:
                        continue
                    step = step_seconds(outcome)
                    if step is not None:
                        cost.observe(k, batch, step)
                        seconds.append(step)
                    if outcome.ttft_s > 0:
                        firsts.append(outcome.ttft_s)
            first = statistics.median(firsts) if firsts else 0.0
            if first > 0:
                cost.calibrate_first_token(k, batch, first)
            if seconds:
                points.append(
                    CalibrationPoint(
                        k, batch, statistics.median(seconds) * 1000, len(seconds), first * 1000
                    )
                )
    log.info(
        "step costs calibrated in %.1f s: %s",
        time.monotonic() - started,
        " ".join(f"b{p.batch}/k{p.k}={p.step_ms:.2f}ms/ttft {p.ttft_ms:.0f}ms" for p in points),
    )
    return points
