"""Measure the engine's step time at every depth before the gateway takes traffic.

The goodput policy divides a class's expected tokens per step by the relative cost
of a step at depth k. The cost model learns that cost online from finished
requests, starting from a prior (`prior_k_cost`, 8 % of a step per drafted token)
that suits a GPU, where verification is nearly free. Elsewhere the prior can be far
off: on a CPU one drafted token can cost most of a step (the drafter's forward
pass is as dear as the target's; `GET /admin/costs` shows the measured ratios), so
until traffic has measured every depth at every load the controller keeps
speculating where it does not pay, or spends real requests on probes
(`cost_probe_share`). Some seconds of synthetic greedy requests at start-up, every
k at a few batch sizes, give it measured costs from the first request on; traffic
refines them as before. The same requests measure the time to the first token at
each depth (`CostModel.first_token`).

Where the engine times its steps (`Engine.on_step`), the calibration files those
steps, as traffic's are filed (`CostModel.observe_step`): a request's mean step,
(e2e - TTFT) / (steps - 1), also holds its first token's edge and its last step's,
which grow with k. Calibrated by request means, a depth the traffic never visits
would keep that bias while the visited ones are priced by steps, and the policy
would compare prices taken two ways. The step clock also gives some fifty to two
hundred samples per depth where request means give four to 32.
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from engine.interface import Engine, EngineStep, GenerateRequest, RequestOutcome
from gateway.control.cost_model import CostModel, step_seconds
from gateway.control.settings import MAX_CALIBRATE_BATCH

log = logging.getLogger("specgw.calibration")

#: Plain prose: every depth drafts the same text, so the runs differ only in k.
PROMPT = (
    "Write a short paragraph about how rivers shape the valleys they run through, "
    "and why their courses change over time."
)


@dataclass(frozen=True, slots=True)
class CalibrationPoint:
    """Median measured seconds of one decode step, and to the first token, at depth k
    and batch size `batch`; `timed_by`: "steps" (the engine's step clock, `samples`
    steps) or "requests" (requests' mean steps, `samples` requests)."""

    k: int
    batch: int
    step_ms: float
    samples: int
    ttft_ms: float = 0.0
    timed_by: str = "requests"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


#: Repeated (with a unique first line) into a prompt no cache holds: the cold prefill.
COLD_REPEATS = 8
#: Pairs of (short, cold) requests timed; each request's fastest run is used, since a
#: busy host only ever adds time and one pair alone can read the cold prompt no slower.
PREFILL_PAIRS = 3


async def _one(
    engine: Engine, request_id: str, k: int, tokens: int, prompt: str = PROMPT
) -> RequestOutcome | None:
    request = GenerateRequest(
        request_id=request_id, prompt=prompt, max_tokens=tokens, ignore_eos=True, k=k
    )
    outcome = None
    async for chunk in engine.generate(request):
        if chunk.outcome is not None:
            outcome = chunk.outcome
    return outcome


def _fresh(outcome: RequestOutcome) -> int:
    return outcome.prompt_tokens - outcome.cached_prompt_tokens


async def _calibrate_prefill(
    engine: Engine, cost: CostModel, nonce: float, rounds: _Rounds | None = None
) -> None:
    """Seconds per cold prompt token: a long prompt no cache holds against the short one.

    A class at k = 0 that probes k = 1 prefills, outside the k = 0 requests' prefix
    cache (`engine.vllm.scheduler`), the prompt tokens its k = 0 runs find cached; the
    probe gate prices that (`exploration.may_pay_at_one`). Both requests at k = 0,
    one after the other, `PREFILL_PAIRS` times (each cold prompt its own); the short
    one is the calibration's own prompt. The price is the difference of the fastest
    times to the first token over the difference of the fresh tokens.
    """
    shorts: list[RequestOutcome] = []
    colds: list[RequestOutcome] = []
    for pair in range(PREFILL_PAIRS):
        tag = f"{nonce:.0f}-{pair}"
        cold = f"Calibration {nonce:.6f} {pair}.\n" + "\n".join([PROMPT] * COLD_REPEATS)
        short = await _one(engine, f"specgw-calibrate-prefill-short-{tag}", 0, 2)
        long = await _one(engine, f"specgw-calibrate-prefill-cold-{tag}", 0, 2, cold)
        if rounds is not None:
            rounds.tick()
        if short is not None and long is not None:
            shorts.append(short)
            colds.append(long)
    if not shorts:
        log.warning("cold prefill not calibrated: the engine returned no outcome")
        return
    tokens = min(map(_fresh, colds)) - max(map(_fresh, shorts))
    extra = min(c.ttft_s for c in colds) - min(s.ttft_s for s in shorts)
    if tokens < 32 or extra <= 0:
        log.warning(
            "cold prefill not calibrated: %d more fresh tokens took %+.2f ms", tokens, extra * 1000
        )
        return
    per_token = extra / tokens
    cost.calibrate_prefill(per_token)
    log.info("cold prefill: %.3f ms per prompt token", per_token * 1000)


#: Batch sizes calibrated where none are configured and the engine verifies each
#: request's own depth (`ControllerSettings.calibrate_batches`).
PER_REQUEST_BATCHES = (1, 2, 4, 8, 16)


def calibration_batches(
    configured: Sequence[int] | None, one_depth_per_step: bool, max_running: int
) -> list[int]:
    """The batch sizes to calibrate: the configured ones; unset, PER_REQUEST_BATCHES where
    each request verifies its own depth, else powers of two up to the engine's largest
    batch, `max_running` (itself included). Where one depth runs per step, traffic at a
    large batch runs only the depths the step rule picks there, so depth 0 (the divisor of
    every relative price) and the deeper ones would come from the fitted shape alone (the
    twin at concurrency 64 on the measured H100 profile read depth 7 at 1.77x depth 0 for a
    true 2.57x; `python -m bench twin`)."""
    if configured is not None:
        return list(configured)
    if not one_depth_per_step:
        return list(PER_REQUEST_BATCHES)
    top = max(1, min(max_running, MAX_CALIBRATE_BATCH))
    batches = [1]
    while batches[-1] * 2 <= top:
        batches.append(batches[-1] * 2)
    return batches if batches[-1] == top else [*batches, top]


#: Timed rounds per depth at each batch size, at least; always an even number. The order
#: of depths alternates between rounds (0..K, then K..0), so a host that speeds up or
#: slows down steadily during the calibration biases every depth alike instead of the
#: last ones measured (each depth's rounds then sit at the same mean time).
MIN_ROUNDS = 2


#: (rounds done, rounds in all): the calibration's progress, after each round.
ProgressReport = Callable[[int, int], None]


def timed_rounds(batch: int, samples: int) -> int:
    """Timed rounds per depth at `batch`: `samples` requests at least, MIN_ROUNDS at least,
    an even number."""
    rounds = max(MIN_ROUNDS, math.ceil(samples / batch))
    return rounds + rounds % 2


def rounds_in_all(max_depth: int, batches: Sequence[int], samples: int) -> int:
    """Every round `calibrate` runs: the warm-up's, the timed ones, the cold-prefill pairs."""
    depths = max_depth + 1
    warm = depths + sum(1 for b in batches if b > 1)
    return warm + sum(timed_rounds(b, samples) * depths for b in batches) + PREFILL_PAIRS


class _Rounds:
    """Counts rounds as they end and reports each count (`ProgressReport`)."""

    def __init__(self, total: int, report: ProgressReport | None) -> None:
        self.done, self.total, self._report = 0, total, report
        if report is not None:
            report(0, total)

    def tick(self) -> None:
        self.done += 1
        if self._report is not None:
            self._report(self.done, self.total)


async def _round(
    engine: Engine, name: str, k: int, batch: int, tokens: int, rounds: _Rounds | None = None
) -> list[RequestOutcome]:
    outcomes = await asyncio.gather(
        *(_one(engine, f"specgw-calibrate-{name}-{i}", k, tokens) for i in range(batch))
    )
    if rounds is not None:
        rounds.tick()
    return [o for o in outcomes if o is not None]


async def _warm_up(
    engine: Engine, batches: Sequence[int], tokens: int, rounds: _Rounds | None = None
) -> None:
    """Untimed: one request at every depth, then one round at the deepest k per batch size.

    The first request after start-up and the first at each depth pay one-off costs
    (buffers, the cold prefill of the calibration prompt in each cache namespace).
    Measured as part of k = 0 at batch 1, the first depth timed, they make a step at
    k = 0 look dearer than at batch 2 and its first token twice that of k = 1 (25 ms
    against 13.5), so speculation looks cheap at concurrency 1 and the controller
    runs tool calls, whose drafts are seldom accepted, at k = 1 to 3 (0.86 of no
    speculation).
    """
    for k in range(engine.max_depth + 1):
        await _round(engine, f"warm-k{k}", k, 1, tokens, rounds)
    for batch in batches:
        if batch > 1:
            await _round(engine, f"warm-b{batch}", engine.max_depth, batch, tokens, rounds)


async def calibrate(
    engine: Engine,
    cost: CostModel,
    batches: Sequence[int],
    tokens: int,
    samples: int,
    progress: ProgressReport | None = None,
) -> list[CalibrationPoint]:
    """Feed `cost` at least `samples` step times per depth 0..K at each batch size.

    A batch of b requests runs concurrently (all at the same k), so each round gives b
    samples at bucket b; rounds repeat until `samples` are in (MIN_ROUNDS at least, an
    even number), each round visiting every depth in alternating order, after an
    untimed warm-up. The round's engine steps that decoded exactly its b requests at
    k are filed (the module's docstring); where the engine times none, each request's
    mean step is. `progress` hears (rounds done, rounds in all) as each round ends.
    """
    started = time.monotonic()
    rounds = _Rounds(rounds_in_all(engine.max_depth, batches, samples), progress)
    log.info(
        "calibrating step costs: depths 0..%d at batch sizes %s",
        engine.max_depth,
        " ".join(map(str, batches)),
    )
    steps: list[EngineStep] = []
    engine.on_step(steps.append)
    try:
        await _warm_up(engine, batches, tokens, rounds)
        points = [
            p
            for batch in batches
            for p in await _calibrate_batch(engine, cost, batch, tokens, samples, steps, rounds)
        ]
    finally:
        engine.on_step(None)
    await _calibrate_prefill(engine, cost, started, rounds)
    log.info(
        "step costs calibrated in %.1f s: %s",
        time.monotonic() - started,
        " ".join(f"b{p.batch}/k{p.k}={p.step_ms:.2f}ms/ttft {p.ttft_ms:.0f}ms" for p in points),
    )
    return points


async def _calibrate_batch(
    engine: Engine,
    cost: CostModel,
    batch: int,
    tokens: int,
    samples: int,
    steps: list[EngineStep],
    counted: _Rounds | None = None,
) -> list[CalibrationPoint]:
    """The timed rounds at one batch size; `steps` collects the engine's timed steps."""
    depths = list(range(engine.max_depth + 1))
    rounds = timed_rounds(batch, samples)
    by_steps: dict[int, list[float]] = {k: [] for k in depths}
    by_requests: dict[int, list[float]] = {k: [] for k in depths}
    firsts: dict[int, list[float]] = {k: [] for k in depths}
    for r in range(rounds):
        for k in depths if r % 2 == 0 else depths[::-1]:
            steps.clear()
            outcomes = await _round(engine, f"b{batch}-k{k}-{r}", k, batch, tokens, counted)
            for step in steps:
                if step.decoded_only(batch, batch * (1 + k)):
                    cost.observe_step(batch, k, step.seconds)
                    by_steps[k].append(step.seconds)
            for outcome in outcomes:
                step_s = step_seconds(outcome)
                if step_s is not None:
                    # Counts the run at k (`Exploration.thin_depths`); files its mean step only
                    # while no engine step has been filed (`CostModel.observe`).
                    cost.observe(k, batch, step_s)
                    by_requests[k].append(step_s)
                if outcome.ttft_s > 0:
                    firsts[k].append(outcome.ttft_s)
    points: list[CalibrationPoint] = []
    for k in depths:
        first = statistics.median(firsts[k]) if firsts[k] else 0.0
        if first > 0:
            cost.calibrate_first_token(k, batch, first)
        timed, by = (by_steps[k], "steps") if by_steps[k] else (by_requests[k], "requests")
        if timed:
            points.append(
                CalibrationPoint(
                    k, batch, statistics.median(timed) * 1000, len(timed), first * 1000, by
                )
            )
    return points
