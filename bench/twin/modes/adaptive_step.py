"""The gateway with the step rule on: one depth per step, chosen for the whole batch.

`adaptive-step`: the control plane runs with `ControllerSettings.step_rule` on, as
the gateway does where the engine verifies one depth per step: every arriving
request goes through it (`AdaptiveControl`: classification, `Controller.decide`,
the batch it enters, `finish(outcome)`), and its plan carries its class's vote (the
live p_1..p_K at admission, the plane's probe depth where it explores), the step
costs of the cost model at that moment and the other classes' estimates that moved
(`Plan.step`, `engine.step_rule.StepArgs`); the engine reads each voter at its class's
newest (`engine.step_rule.Estimates`).
Each step's depth is then what the engine's scheduler computes from those same
inputs (`engine.step_rule.vote_step_depth`, called by `engine.vllm.step_votes`):
the voters of the step, the newest step costs, whether newcomers enter, with the
guard that no request loses by the depth (`GUARD`, `None` in `adaptive-step-free`).
No hindsight: the rule reads only what the controller has learned.

Every voter verifies the step's depth; a request at k = 0 (its class's own depth at
its load, or a probe of 0) rides (`ControlPlane._with_vote`, `StepVote.rides`): it
verifies the depth its step's voters set, counted at its class's E[tokens | d] without
a say in the depth, and none for good once a step without voters skips the drafter (the
drafter prefills every prompt in a step it runs in: Model Runner V2 drafts the step's
depth for the whole batch; on the gateway's engine a step without voters skips it,
prefills included), as in the engine (`engine.vllm.step_votes`). Steps are filed in
the cost model by the plane (`ControlPlane.observe_step`: a decode-only step of the
requests in flight, each verifying the same d drafts, ran at d), as the gateway files
them. A record's k (and
its class's choice) is the depth the rule gives its class alone at its arrival's load:
its vote, which settles as the controller learns; the steps it ran in follow the batch.
A request a batch rule held at 0 while its class chose a depth rides, but its class's
choice is the depth its vote would get (`metrics`: settling reads the class's choice,
not what the batch rules fitted the request to).
A step whose voters the rule holds at depth 0 keeps their drafter KV: it costs a
depth-1 step where the profile's depth 0 skips the drafter (the V1 runner: the engine
drafts one, verified by none) and the profile's k = 0 elsewhere (Model Runner V2 runs
the drafter's KV pass); a step without voters is one no request drafts in
(`drafts_once_at_zero`, `StepCosts.on_gateway`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from bench.twin.costs import StepCosts
from bench.twin.engine import LiveRequest, Plan, VirtualClock
from bench.twin.modes.adaptive import AdaptiveControl, Trace
from bench.twin.requests import TwinRequest
from bench.twin.schema import Workload
from engine.interface import EngineStep, RequestOutcome
from engine.step_rule import (
    GUARD,
    RETIRE_AFTER,
    Estimates,
    StepCostTable,
    StepVote,
    held_after,
    vote_step_depth,
)

__all__ = ["GUARD", "AdaptiveStep"]


class AdaptiveStep(AdaptiveControl):
    """Per-step depths from the engine's step rule on the plane's votes and costs."""

    engine_wide = True
    #: Only voters, and riders beside voters, verify the step's depth (`drafts`).
    bounded = True

    def __init__(
        self,
        workload: Workload,
        costs: StepCosts,
        clock: VirtualClock,
        seed: int,
        guard: float | None = GUARD,
        trace: Trace | None = None,
        queue_weight: float = 0.0,
    ) -> None:
        super().__init__(
            workload, costs, clock, seed, trace=trace, step_rule=True, queue_weight=queue_weight
        )
        self._guard = guard
        self._max_k = costs.max_k
        #: The engine skips the drafter, prefills included, in a step without voters.
        self._idle_skips = costs.idle_skips_drafter
        #: The newest step costs a request brought (the engine keeps the newest).
        self._table: StepCostTable | None = None
        #: The rule's last inputs (table, batch, newcomers, votes) and answer.
        self._last: tuple[StepCostTable, int, bool, list[StepVote]] | tuple[()] = ()
        self._last_depth = 0
        #: Requests entered since the last step: they prefill (and draft first) in the next.
        self._newcomers = 0
        #: Each class's newest estimates, as the engine keeps them.
        self._estimates = Estimates()
        #: Voters in the last step `step_depth` set.
        self._voters = 0
        #: Each voter's run of steps held at depth 0, by request index, and the voters
        #: that ran past `RETIRE_AFTER` (k = 0 for the rest of their life), as the engine.
        self._held: dict[int, int] = {}
        self._retired: set[int] = set()
        #: Riders of the last step, those entered since, whether one entered with a vote,
        #: and the riders whose drafter KV has a gap (k = 0 for the rest of their life).
        self._riding: list[int] = []
        self._new_riders: list[int] = []
        self._new_voter = False
        self._dropped: set[int] = set()

    @property
    def drafts_once_at_zero(self) -> bool:  # type: ignore[override]
        """A step held at 0 keeps its voters' drafter KV (they may draft later); a step of
        requests without votes (k = 0 for life) is one no request drafts in."""
        return self._voters > 0

    def drafts(self, live: LiveRequest) -> bool:
        """A voter drafts unless retired; a rider beside voters while its drafter KV is
        whole (`engine.vllm.step_votes`)."""
        index, planned = live.plan.handle
        step = planned.step
        if step is None:
            return False
        if step.vote.rides:
            return self._voters > 0 and index not in self._dropped
        return index not in self._retired

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        plan = super().arrive(request, running, queued)
        step = plan.handle[1].step
        if step is None:
            return plan
        self._table = step.costs
        self._estimates.take(step.vote, step.news)
        self._last = ()  # the estimates moved: the next step recomputes
        solo = vote_step_depth([step.vote], step.costs, running + 1, False, None, self._guard)
        chosen = solo
        if step.vote.probe or (step.vote.rides and plan.chosen):
            # Its class's vote is the one it sends without the plane's probe, and where its
            # class chose a depth here and a batch rule held this request at 0
            # (`BatchDepth.fit`), the one it would have sent.
            voted = replace(step.vote, probe=0, rides=False)
            chosen = vote_step_depth([voted], step.costs, running + 1, False, None, self._guard)
        # A probe of the plane's exploration asks for its depth: alone in its step it gets it.
        return Plan(max(solo, min(step.vote.probe, self._max_k)), None, plan.handle, chosen)

    def prefills_drafter(self, k: int) -> bool:
        # Model Runner V2 drafts over the whole step: where the gateway's engine skips
        # the drafter in a step without voters, the engine prices that step by step.
        return not self._idle_skips

    def enter(self, plan: Plan) -> None:
        super().enter(plan)
        self._newcomers += 1
        index, planned = plan.handle
        if planned.step is not None:
            if planned.step.vote.rides:
                self._new_riders.append(index)
            else:
                self._new_voter = True

    def step_depth(self, batch: int, running: Sequence[LiveRequest] = ()) -> int:
        table = self._table
        votes: list[StepVote] = []
        voters: list[int] = []
        riding = self._riding = []
        for live in running:
            index, planned = live.plan.handle
            step = planned.step
            if step is None:
                continue
            if step.vote.rides:
                if index not in self._dropped:
                    votes.append(step.vote)
                    riding.append(index)
            elif index not in self._retired:
                votes.append(step.vote)
                voters.append(index)
        if table is None:
            self._voters = len(voters)
            return max((live.plan.k for live in running), default=0)
        newcomers = self._newcomers > 0
        if not self._same(table, batch, newcomers, votes):
            self._last = (table, batch, newcomers, votes)
            self._last_depth = vote_step_depth(
                votes,
                table,
                batch,
                newcomers,
                None,
                self._guard,
                self._estimates,
                batch - len(votes),
            )
        depth = self._last_depth
        # A voter held at 0 for RETIRE_AFTER steps runs at k = 0 from this step on, as in
        # the engine (`engine.vllm.step_votes`); a step left without voters is idle.
        for index in voters:
            held = held_after(self._held.get(index, 0), depth)
            if held >= RETIRE_AFTER:
                self._retired.add(index)
                self._held.pop(index, None)
            else:
                self._held[index] = held
        self._voters = sum(1 for index in voters if index not in self._retired)
        return depth

    def _same(
        self, table: StepCostTable, batch: int, newcomers: bool, votes: list[StepVote]
    ) -> bool:
        """Whether the rule's inputs are the last call's: the plane builds one vote per
        request and replaces (never mutates) its cost table, so identity is equality."""
        if not self._last:
            return False
        last_table, last_batch, last_newcomers, last_votes = self._last
        return (
            table is last_table
            and batch == last_batch
            and newcomers == last_newcomers
            and len(votes) == len(last_votes)
            and all(a is b for a, b in zip(votes, last_votes, strict=True))
        )

    def observe_step(self, step: EngineStep) -> None:
        # A step without voters skips the drafter: the riders in it, newcomers included,
        # lose their drafter KV's continuity (`engine.vllm.step_votes`).
        if not ((step.decode_requests and self._voters) or self._new_voter):
            self._dropped.update(self._riding if step.decode_requests else ())
            self._dropped.update(self._new_riders)
        self._riding = []
        self._new_riders = []
        self._new_voter = False
        self._newcomers = 0
        super().observe_step(step)

    def finish(self, plan: Plan, outcome: RequestOutcome | None) -> None:
        index = plan.handle[0]
        self._held.pop(index, None)
        self._retired.discard(index)
        self._dropped.discard(index)
        super().finish(plan, outcome)
