"""The gateway's controller with one depth per step chosen for the whole batch.

`adaptive-step`: every arriving request still goes through the real control plane
(`AdaptiveControl`: classification, `Controller.decide`, the batch it enters,
`finish(outcome)`), so the controller keeps learning each class's acceptance
online; but the engine verifies one depth per step, as vLLM's CUDA engine does
(`engine/vllm/batch_depth.py`), and that depth comes from the step-depth rule
(`gateway.control.step_depth.choose_step_depth`) over the requests in the step:
each request's class's live estimates p_1..p_K (`Controller.acceptance_of`) and
the controller's relative step costs at that batch size
(`CostModel.relative_costs`), plus, in a step that newcomers enter, their first
drafts at that depth (`CostModel.first_token`: the engine drafts every newcomer's
first chain at the step's depth), with the guard that no request loses by the
depth (`GUARD`); a step of one class holding one of the plane's probes (`explored`) runs
at least at the probe's depth, so positions past the class's vote keep getting trials. No
hindsight: the rule reads only what the controller has learned.

Every request drafts the step's depth (the drafter prefills every prompt: Model
Runner V2 drafts the step's depth for the whole batch); the rule would leave out
only a request with p_1 = 0, which the controller's Beta prior never estimates.
Each decode-only step is filed in the cost model at its batch and depth
(`Controller.observe_step`), as the engine's step clock would file it; the
plane's own filing matches steps to per-request depths, which this engine does
not run. A record's k (and its class's choice) is the depth the rule gives its
class alone at its arrival's load: the class's own vote, which settles as the
controller learns; the steps it ran in follow the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.twin.costs import StepCosts
from bench.twin.engine import LiveRequest, Plan, VirtualClock
from bench.twin.modes.adaptive import AdaptiveControl, Trace
from bench.twin.requests import TwinRequest
from bench.twin.schema import Workload
from engine.interface import EngineStep
from gateway.control.settings import ControllerSettings
from gateway.control.step_depth import choose_step_depth

#: No request's tokens per unit time at the step's depth below this share of the same
#: step at depth 0 (`choose_step_depth`'s `floor`): speculation is never a request's loss.
GUARD = 1.0


class AdaptiveStep(AdaptiveControl):
    """Per-step depths from the step-depth rule on the controller's live estimates."""

    engine_wide = True

    def __init__(
        self,
        workload: Workload,
        costs: StepCosts,
        clock: VirtualClock,
        seed: int,
        guard: float | None = GUARD,
        trace: Trace | None = None,
    ) -> None:
        super().__init__(workload, costs, clock, seed, trace=trace)
        self._controller = self.plane.controller
        self._guard = guard
        self._depth = 0
        #: The rule's last inputs and answer (`_same_inputs`).
        self._last: tuple[list[tuple[Sequence[float], int]], Sequence[float]] = ([], ())
        self._last_depth = 0
        #: Requests entered since the last step: they prefill (and draft first) in the next.
        self._newcomers = 0
        #: A class the controller does not hold (evicted): the prior's P(accept 1).
        self._prior = (ControllerSettings().prior_accept,)

    def _acceptance(self, class_id: str) -> Sequence[float]:
        return self._controller.acceptance_of(class_id) or self._prior

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        plan = super().arrive(request, running, queued)
        planned = plan.handle[1]
        costs = self._controller.cost_model.relative_costs(running + 1)
        acceptance = self._acceptance(planned.class_id)
        solo = choose_step_depth([(acceptance, 1)], costs, self._guard).depth
        decision = planned.plan.decision
        if decision is not None and decision.explored and planned.k > solo:
            # The plane's probe keeps its depth (`step_depth`): a class whose steps never
            # run past its vote would never try, and so never re-learn, the deeper positions.
            return Plan(planned.k, None, plan.handle, solo)
        return Plan(solo, None, plan.handle, solo)

    def prefills_drafter(self, k: int) -> bool:
        return True

    def enter(self, plan: Plan) -> None:
        super().enter(plan)
        self._newcomers += 1

    def step_depth(self, batch: int, running: Sequence[LiveRequest] = ()) -> int:
        counts: dict[str, int] = {}  # insertion order: the batch's, so deterministic
        probe = 0
        for live in running:
            plan = live.plan
            class_id = plan.handle[1].class_id
            counts[class_id] = counts.get(class_id, 0) + 1
            if plan.k > probe and plan.k != plan.chosen:
                probe = plan.k
        groups = [(self._acceptance(c), n) for c, n in counts.items()]
        costs = self._step_costs(batch)
        if not self._same_inputs(groups, costs):
            self._last = (groups, costs)
            self._last_depth = choose_step_depth(groups, costs, self._guard).depth
        # A probe runs the step at its depth only where its class is the whole step: in
        # a mixed batch every request would pay for it (c(B, probe) against c(B, d)), and
        # there the other classes' deeper votes already try those positions.
        self._depth = max(self._last_depth, probe) if len(counts) == 1 else self._last_depth
        return self._depth

    def _same_inputs(
        self, groups: list[tuple[Sequence[float], int]], costs: Sequence[float]
    ) -> bool:
        """Whether the rule's inputs are the last call's: the same estimate and cost
        objects (the controller replaces them, never mutates them, when evidence moves)
        with the same counts. Most steps repeat the last one's inputs."""
        last_groups, last_costs = self._last
        return (
            costs is last_costs
            and len(groups) == len(last_groups)
            and all(a is b and n == m for (a, n), (b, m) in zip(groups, last_groups, strict=True))
        )

    def _step_costs(self, batch: int) -> Sequence[float]:
        """The step's relative cost at each depth: the decode step, plus the newcomers'
        first drafts at that depth where any entered (`CostModel.first_token`: time to
        the first token at depth d over depth 0, in steps at k = 0)."""
        model = self._controller.cost_model
        costs = model.relative_costs(batch)
        first = model.first_token(batch) if self._newcomers else ()
        if len(first) != len(costs):
            return costs
        return [c + max(f - first[0], 0.0) for c, f in zip(costs, first, strict=True)]

    def observe_step(self, step: EngineStep) -> None:
        if self._trace is not None:
            self._trace.events.append(("step", self._clock.now, step))
        self._newcomers = 0
        if step.prefill_requests == 0 and step.decode_requests > 0:
            self._controller.observe_step(step.decode_requests, self._depth, step.seconds)
