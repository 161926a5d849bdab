"""The gateway's adaptive mode: the real control plane decides every depth.

Nothing here decides: each arriving request's sample body goes through
`ControlPlane.plan_chat` / `plan_completion` (the gateway's classification,
`Controller.decide` with the flags' default overrides, the batch rules), the
engine applies the plan's k and cap, `enter` / `finish(outcome)` report the
request's life in the batch, and every engine step goes to
`ControlPlane.observe_step`, as the gateway's step clock does. The controller
is calibrated first by `gateway.calibration.calibrate` on the twin
(`bench.twin.modes.calibration`), as the gateway calibrates before it serves.

`adaptive-floor` is the same with every class's `batch-floor` flag set
(`FLOOR`); `adaptive` keeps the flag at the gateway's default for the profile's
engine (`ControllerSettings.batch_floor_for`: on where each request verifies its
own depth). The controller's K is the profile's (`ControllerSettings.max_k`);
every other setting and flag keeps its default. A `Trace` records what the plane
was asked and what the engine ran, so a test can replay it through a fresh plane.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from bench.twin.costs import StepCosts
from bench.twin.engine import Plan, VirtualClock
from bench.twin.modes.calibration import calibrate_on_twin, twin_calibration_batches
from bench.twin.modes.static import EngineWide
from bench.twin.requests import TwinRequest
from bench.twin.schema import Workload
from engine.interface import EngineStep, RequestOutcome
from gateway.control.classify import RequestClass
from gateway.control.controller import Controller
from gateway.control.decision import ControlOverrides
from gateway.control.events import ControlEvents, DecisionChange, DriftEvent
from gateway.control.features import ChatView, sampling_bucket
from gateway.control.plane import ControlPlane, PlannedRequest
from gateway.control.settings import ControllerSettings
from gateway.flags.values import FlagValues
from gateway.planner import overrides_from_flags

#: `batch-floor` of every class in `adaptive-floor`.
FLOOR = 0.95


def controller_settings(max_k: int, queue_weight: float = 0.0) -> ControllerSettings:
    """The controller's defaults with K = the profile's deepest depth (and the goodput
    policy's `queue_weight` where not 0: `gateway.control.policies.goodput`)."""
    base = ControllerSettings()
    update: dict[str, Any] = {"max_k": max_k, "default_k": min(base.default_k, max_k)}
    if queue_weight:
        update["policy_params"] = {**base.policy_params, "queue_weight": queue_weight}
    return base.model_copy(update=update)


class TwinEvents:
    """The controller's events, kept: drift alarms as (virtual seconds, class label)."""

    def __init__(self, clock: VirtualClock) -> None:
        self._clock = clock
        self.drifts: list[tuple[float, str]] = []

    def on_decision_change(self, change: DecisionChange) -> None:
        return None

    def on_drift(self, event: DriftEvent) -> None:
        self.drifts.append((self._clock.now, event.label))

    def on_class_evicted(self, cls: RequestClass) -> None:
        return None


@dataclass(slots=True)
class Trace:
    """What the plane was asked and what the engine ran, in order, as (kind, seconds, ...):
    ("plan", t, index, endpoint, body, prompt_tokens, running, queued, sampling),
    ("enter", t, index, k, cap) with the depth and cap the engine applied,
    ("step", t, EngineStep), ("finish", t, index, outcome)."""

    events: list[tuple[Any, ...]] = field(default_factory=list)


class AdaptiveControl(EngineWide):
    """Per-request depths from `ControlPlane`; steps and outcomes back to it."""

    engine_wide = False
    observes = True

    def __init__(
        self,
        workload: Workload,
        costs: StepCosts,
        clock: VirtualClock,
        seed: int,
        floor: float | None = None,
        trace: Trace | None = None,
        step_rule: bool = False,
        queue_weight: float = 0.0,
    ) -> None:
        self.events = TwinEvents(clock)
        self.plane = build_plane(costs, clock, seed, floor, self.events, step_rule, queue_weight)
        self._clock = clock
        self._workload = workload
        self._trace = trace
        self._sampling = {
            name: sampling_bucket(c.temperature) for name, c in workload.classes.items()
        }

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        spec = self._workload.classes[request.class_name]
        sampling = self._sampling[request.class_name]
        prompt = request.prompt_tokens
        planned = plan_request(
            self.plane, spec.endpoint, spec.request, prompt, running, queued, sampling
        )
        plan = Plan(planned.k, planned.cap, (request.index, planned), self._chosen(planned))
        if self._trace is not None:
            self._trace.events.append(
                (
                    "plan",
                    self._clock.now,
                    request.index,
                    spec.endpoint,
                    spec.request,
                    prompt,
                    running,
                    queued,
                    sampling,
                )
            )
        return plan

    def _chosen(self, planned: PlannedRequest) -> int:
        """The depth its class chose at its load (`RequestRecord.chosen`,
        `ControlPlane.class_choice`)."""
        decision = planned.plan.decision
        return planned.k if decision is None else self.plane.class_choice(decision)

    def prefills_drafter(self, k: int) -> bool:
        return k > 0

    def enter(self, plan: Plan) -> None:
        index, planned = plan.handle
        if self._trace is not None:
            self._trace.events.append(("enter", self._clock.now, index, plan.k, plan.cap))
        planned.enter()

    def observe_step(self, step: EngineStep) -> None:
        if self._trace is not None:
            self._trace.events.append(("step", self._clock.now, step))
        self.plane.observe_step(step)

    def finish(self, plan: Plan, outcome: RequestOutcome | None) -> None:
        index, planned = plan.handle
        if self._trace is not None:
            self._trace.events.append(("finish", self._clock.now, index, outcome))
        planned.finish(outcome)


def plan_request(
    plane: ControlPlane,
    endpoint: str,
    body: dict[str, Any],
    prompt_tokens: int,
    running: int,
    queued: int,
    sampling: str,
) -> PlannedRequest:
    """Plan one request through the plane's chat or completions path."""
    if endpoint == "chat":
        view = ChatView.of(body)
        return plane.plan_chat(
            view, prompt_tokens, running=running, queued=queued, sampling=sampling
        )
    return plane.plan_completion(
        body["prompt"], prompt_tokens, running=running, queued=queued, sampling=sampling
    )


def build_plane(
    costs: StepCosts,
    clock: VirtualClock,
    seed: int,
    floor: float | None = None,
    events: ControlEvents | None = None,
    step_rule: bool = False,
    queue_weight: float = 0.0,
) -> ControlPlane:
    """A calibrated control plane as the gateway builds one, on the twin's clock;
    `floor`: every class's `batch-floor`, None = the gateway's default for the engine."""
    settings = controller_settings(costs.max_k, queue_weight)
    if floor is None:
        floor = settings.batch_floor_for(costs.uniform)
    controller = Controller(
        settings,
        max_depth=costs.max_k,
        events=events or TwinEvents(clock),
        rng=random.Random(seed),
        clock=clock,
    )
    if twin_calibration_batches(costs, settings):
        calibrate_on_twin(controller.cost_model, costs, settings, seed)
    overrides: ControlOverrides = overrides_from_flags(FlagValues(batch_floor=floor))
    return ControlPlane(
        controller, overrides=lambda _cid, _label: overrides, clock=clock, step_rule=step_rule
    )
