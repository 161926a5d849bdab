"""The twin behind the gateway's engine seam, so `gateway.calibration.calibrate` runs on it.

Before it serves, the gateway measures every depth at a few batch sizes with
synthetic requests and files the engine's timed steps into the cost model
(`gateway.calibration`). The twin's adaptive mode calls that same function; this
module is the `engine.interface.Engine` it drives: each round's concurrent
`generate` calls become one batch replayed by `bench.twin.engine.simulate` (all
entering in one step, as the round's requests do), whose steps reach the
listener set with `on_step` and whose outcomes end the streams.

A calibration request's prompt tokens are its characters / 4 (the gateway's own
estimate), digits counted as one character: the calibration's cold prompt carries
a time stamp, whose length must not change a virtual run. Its drafts are accepted
at `ACCEPTANCE` per position (step costs do not depend on acceptance; only the
number of steps does).
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from bench.twin.costs import StepCosts
from bench.twin.engine import Plan, VirtualClock, simulate
from bench.twin.modes.static import EngineWide
from bench.twin.requests import TwinRequest, accepted_runs, conditional
from bench.twin.schema import MAX_DEPTH
from engine.interface import (
    EngineHealth,
    EngineStep,
    GenerateRequest,
    GenerationChunk,
    RequestOutcome,
    StepListener,
)
from gateway.calibration import CalibrationPoint, calibrate, calibration_batches
from gateway.control.cost_model import CostModel
from gateway.control.settings import ControllerSettings

#: Conditional acceptance of every draft position in calibration requests.
ACCEPTANCE = 0.7
#: Step-jitter index stride between calibration rounds (`StepCosts.noise`): rounds read
#: stretches apart from each other and from the traffic's first steps.
CALIBRATION_NOISE_STRIDE = 4099
_DIGITS = re.compile(r"[0-9.]+")


def prompt_tokens(text: str) -> int:
    """The gateway's estimate (characters / 4), a run of digits counted as one."""
    return max(1, len(_DIGITS.sub("0", text)) // 4)


class _Round(EngineWide):
    """Each calibration request at its own k; the engine's steps go to the listener."""

    engine_wide = False
    observes = True

    def __init__(self, listener: StepListener | None, depths: dict[int, int]) -> None:
        self._listener = listener
        self._depths = depths
        self.outcomes: dict[int, RequestOutcome] = {}

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        return Plan(self._depths[request.index], handle=request.index)

    def prefills_drafter(self, k: int) -> bool:
        return k > 0

    def observe_step(self, step: EngineStep) -> None:
        if self._listener is not None:
            self._listener(step)

    def finish(self, plan: Plan, outcome: RequestOutcome | None) -> None:
        if outcome is not None:
            self.outcomes[plan.handle] = outcome


class TwinCalibrationEngine:
    """`engine.interface.Engine` over the twin; only what calibration uses is real."""

    def __init__(self, costs: StepCosts, seed: int) -> None:
        self._costs = costs
        self._seed = seed
        self._listener: StepListener | None = None
        self._pending: list[tuple[GenerateRequest, asyncio.Future[RequestOutcome]]] = []
        self._runner: asyncio.Task[None] | None = None
        self._made = 0
        self._rounds = 0

    @property
    def max_depth(self) -> int:
        return self._costs.max_k

    @property
    def lossless_sampling(self) -> bool:
        return True

    @property
    def one_depth_per_step(self) -> bool:
        return self._costs.uniform

    def on_step(self, listener: StepListener | None) -> None:
        self._listener = listener

    async def generate(self, request: GenerateRequest) -> AsyncIterator[GenerationChunk]:
        future: asyncio.Future[RequestOutcome] = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if self._runner is None or self._runner.done():
            self._runner = asyncio.ensure_future(self._run())
        outcome = await future
        yield GenerationChunk(request.request_id, "", (), True, "length", outcome)

    async def _run(self) -> None:
        await asyncio.sleep(0)  # every request of the round registers first
        batch, self._pending = self._pending, []
        requests = [self._request(r) for r, _ in batch]
        k_max = self._costs.max_k
        depths = {t.index: min(r.k, k_max) for t, (r, _) in zip(requests, batch, strict=True)}
        source = _Round(self._listener, depths)
        # Each round reads its own stretch of the step jitter (a run's index 0 onwards
        # is the traffic's).
        self._rounds += 1
        simulate(
            requests,
            source,
            self._costs,
            VirtualClock(),
            clients=len(requests),
            noise_start=CALIBRATION_NOISE_STRIDE * self._rounds,
        )
        for (_, future), request in zip(batch, requests, strict=True):
            future.set_result(source.outcomes[request.index])

    def _request(self, request: GenerateRequest) -> TwinRequest:
        index = self._made
        self._made += 1
        p = conditional([ACCEPTANCE], 1.0)
        draws = np.random.default_rng([self._seed, 1, index]).random(
            (request.max_tokens, MAX_DEPTH)
        )
        return TwinRequest(
            index,
            "calibration",
            0,
            0,
            0,
            prompt_tokens(request.prompt or ""),
            request.max_tokens,
            p,
            accepted_runs(draws, p),
        )

    async def abort(self, request_id: str) -> None:
        return None

    async def health(self) -> EngineHealth:
        return EngineHealth(alive=True, ready=True)

    async def reset_prefix_cache(self) -> bool:
        return True

    async def shutdown(self) -> None:
        return None


#: One cost-model call calibration made: (method name, arguments).
Call = tuple[str, tuple[Any, ...]]


class RecordingCostModel(CostModel):
    """A cost model that also keeps, in order, the evidence calibration filed into it."""

    def __init__(self, settings: ControllerSettings) -> None:
        super().__init__(
            settings.max_k,
            settings.prior_step_s,
            settings.prior_k_cost,
            settings.prior_batch_saturation,
            settings.cost_prior_weight,
            settings.cost_forgetting,
            settings.cost_step_forgetting,
        )
        self.calls: list[Call] = []

    def observe(
        self, k: int, batch: int, seconds: float, depth: float | None = None, clean: bool = True
    ) -> None:
        self.calls.append(("observe", (k, batch, seconds, depth, clean)))
        super().observe(k, batch, seconds, depth, clean)

    def observe_step(self, batch: int, depth: int, seconds: float) -> None:
        self.calls.append(("observe_step", (batch, depth, seconds)))
        super().observe_step(batch, depth, seconds)

    def calibrate_first_token(self, k: int, batch: int, seconds: float) -> None:
        self.calls.append(("calibrate_first_token", (k, batch, seconds)))
        super().calibrate_first_token(k, batch, seconds)

    def calibrate_prefill(self, seconds_per_token: float) -> None:
        self.calls.append(("calibrate_prefill", (seconds_per_token,)))
        super().calibrate_prefill(seconds_per_token)


#: (step costs, settings as JSON, seed) -> (what calibration filed, its points): every
#: controlled mode of one seed calibrates on the same twin, and the calibration reads
#: nothing of the cost model it fills, so its calls are made once and replayed.
_RECORDED: dict[tuple[StepCosts, str, int], tuple[list[Call], list[CalibrationPoint]]] = {}
#: Recordings kept (a run goes through its seeds in turn).
_KEEP = 2


def _recorded(
    costs: StepCosts, settings: ControllerSettings, seed: int
) -> tuple[list[Call], list[CalibrationPoint]]:
    key = (costs, settings.model_dump_json(), seed)
    found = _RECORDED.get(key)
    if found is None:
        recorder = RecordingCostModel(settings)
        engine = TwinCalibrationEngine(costs, seed)
        points = asyncio.run(
            calibrate(
                engine,
                recorder,
                twin_calibration_batches(costs, settings),
                settings.calibrate_tokens,
                math.ceil(settings.cost_min_samples),
            )
        )
        found = (recorder.calls, points)
        while len(_RECORDED) >= _KEEP:
            del _RECORDED[next(iter(_RECORDED))]
        _RECORDED[key] = found
    return found


#: The deployment the twin models admits this many requests at once (the gateway's
#: `max_running`): the largest concurrency of the standard arrivals.
MAX_RUNNING = 64


def twin_calibration_batches(costs: StepCosts, settings: ControllerSettings) -> list[int]:
    """The batch sizes the gateway would calibrate on this engine (`calibration_batches`)."""
    return calibration_batches(settings.calibrate_batches, costs.uniform, MAX_RUNNING)


def calibrate_on_twin(
    cost: CostModel, costs: StepCosts, settings: ControllerSettings, seed: int
) -> list[CalibrationPoint]:
    """The gateway's start-up calibration (`gateway.runtime`), on the twin: the cost model
    receives the same calls in the same order as `calibrate` makes them (replayed from
    the first run for these costs, settings and seed), so it ends in the same state."""
    calls, points = _recorded(costs, settings, seed)
    for name, args in calls:
        getattr(cost, name)(*args)
    return list(points)
