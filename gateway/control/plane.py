"""The control plane owns each request's life: plan it, track it in the batch, learn from its end.

`ControlPlane.plan_chat` / `plan_completion` turn a request view and the load into a
`PlannedRequest`: its class and depth k (`Controller.classify`, the class's ops
overrides, `Controller.decide`). The request's life in the engine batch
(`BatchLoad`) is the plane's too: `enter` as the engine adds it (applying the cap it
carries), `finish(outcome)` as it leaves, which feeds `Controller.observe` the batch
it ran in (means over its life). Timed engine steps come in through `observe_step`.

The gateway's request service and the benchmark's engine twin both call this one
object, so both run the same rules; nothing here knows HTTP or vLLM.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from engine.interface import EngineStep, RequestOutcome
from engine.step_rule import StepArgs, StepVote
from gateway.control.batch_load import BatchLoad, BatchMeans, Ticket
from gateway.control.classify import RequestClass
from gateway.control.controller import Controller
from gateway.control.decision import ControlOverrides, LoadSnapshot, SpeculationDecision
from gateway.control.features import (
    ChatView,
    IdentityCache,
    RequestFeatures,
    features_from_chat,
    features_from_completion,
)

#: (class id, label) -> the ops overrides for that class; None: adaptive, no flags.
Overrides = Callable[[str, str], ControlOverrides | None]


class Plan(NamedTuple):
    """What the control plane decided for one request, and why.

    A NamedTuple: one is built per request on the decision path, where a frozen
    dataclass costs about a microsecond more (`bench/decision_latency.py`).
    """

    class_id: str
    label: str
    k: int
    reason: str
    #: The controller's class and decision, passed back to `Controller.observe`.
    cls: RequestClass | None = None
    decision: SpeculationDecision | None = None
    #: Expected tokens per step were the batch to run at depth D (`BatchLoad.enter`).
    gains: tuple[float, ...] = ()
    #: The class's `batch-floor` flag: what it keeps when a deeper request joins (0 = off).
    floor: float = 0.0
    #: Lower the requests in flight to at most this depth as this one enters (None: no).
    cap: int | None = None
    #: The depth its class chose, where it rides deeper at the batch's (None: k).
    anchor: int | None = None
    #: Its k is an operator's (`SpeculationDecision.fixed`): no newcomer lowers it.
    fixed: bool = False
    #: With the step rule on: its class's vote and the step costs, sent to the engine,
    #: whose scheduler then sets its depth per step, at most `bound` (None: k is its depth).
    step: StepArgs | None = None
    bound: int = 0


class PlannedRequest:
    """One request's plan and its life in the engine batch: `enter`, then `finish` once.

    `finish` is idempotent, so every exit path of a caller may call it.
    """

    __slots__ = ("_done", "_plane", "_prompt_tokens", "_ticket", "plan")

    def __init__(self, plane: ControlPlane, plan: Plan, prompt_tokens: int) -> None:
        self._plane = plane
        self.plan = plan
        self._prompt_tokens = prompt_tokens
        self._ticket: Ticket | None = None
        self._done = False

    @property
    def k(self) -> int:
        return self.plan.k

    @property
    def cap(self) -> int | None:
        return self.plan.cap

    @property
    def engine_k(self) -> int:
        """The k the engine is sent: the step rule's bound for a voter, else k."""
        plan = self.plan
        return plan.bound if plan.step is not None else plan.k

    @property
    def step(self) -> StepArgs | None:
        return self.plan.step

    @property
    def label(self) -> str:
        return self.plan.label

    @property
    def class_id(self) -> str:
        return self.plan.class_id

    @property
    def reason(self) -> str:
        return self.plan.reason

    def headers(self) -> dict[str, str]:
        """The response headers that say what the plane decided."""
        return {"x-specgw-class": self.plan.label, "x-specgw-k": str(self.plan.k)}

    def without_speculation(self, reason: str) -> PlannedRequest:
        """The same request at k = 0 (before it entered): the controller still hears
        its outcome, a k = 0 run, so its class's statistics stay honest."""
        if self._ticket is not None:
            raise RuntimeError("a request's depth is fixed once it entered the engine")
        plan = self.plan._replace(k=0, reason=reason, gains=(), step=None)
        return PlannedRequest(self._plane, plan, self._prompt_tokens)

    def enter(self) -> None:
        """The engine adds the request now (and lowers its batch to `cap`, if any)."""
        if self._ticket is None and not self._done:
            self._ticket = self._plane._enter(self.plan, self._prompt_tokens)

    def finish(self, outcome: RequestOutcome | None) -> BatchMeans | None:
        """The request left the engine; `outcome` None: it did not complete (no learning).

        Returns the batch it ran in (means over its life), None if it never entered.
        """
        if self._done:
            return None
        self._done = True
        if self._ticket is None:
            return None
        return self._plane._finish(self.plan, self._ticket, outcome)


class ControlPlane:
    """Classification, the controller's decision and the batch in flight, in one object."""

    def __init__(
        self,
        controller: Controller,
        *,
        overrides: Overrides | None = None,
        identities: IdentityCache | None = None,
        clock: Callable[[], float] = time.monotonic,
        step_rule: bool = False,
    ) -> None:
        self.controller = controller
        #: The engine sets each step's depth from the requests' votes (`engine.step_rule`).
        self.step_rule = step_rule
        #: Voters in flight per class, and the estimates last sent for each such class.
        self._voting: dict[str, int] = {}
        self._sent: dict[str, tuple[float, ...]] = {}
        self._overrides = overrides
        self._identities = identities or IdentityCache()
        #: The engine batch the requests run in, for the cost model and the batch rules.
        self.batch = BatchLoad(clock)

    # ---- request path ----------------------------------------------------------------
    def load(self, running: int, queued: int = 0) -> LoadSnapshot:
        """Load at decision time: `running` requests admitted (this one excluded), the
        batch in flight as `BatchLoad` tracks it."""
        batch = self.batch
        return LoadSnapshot(
            running=running,
            queued=queued,
            mates=batch.gains,
            guarded=batch.guarded,
            deepest=batch.deepest,
            anchored=batch.anchored,
            fixed=batch.fixed,
        )

    def plan_features(
        self,
        features: RequestFeatures,
        prompt_tokens: int,
        load: LoadSnapshot,
        unserved: str = "",
    ) -> PlannedRequest:
        """Classify, resolve the class's flags, decide k: the request path after parsing.

        `unserved`: why the request must not draft (`features.unserved_by_drafts`); it
        runs at k = 0 then, whatever the class's decision or an operator's flag says.
        """
        controller = self.controller
        cls = controller.classify(features)
        o = self._overrides(cls.class_id, cls.label) if self._overrides is not None else None
        decision = controller.decide(cls, load, o)
        plan = Plan(
            cls.class_id,
            cls.label,
            decision.k,
            decision.reason,
            cls,
            decision,
            decision.gains,
            o.batch_floor if o is not None else 0.0,
            decision.batch_cap,
            decision.anchor,
            decision.fixed,
        )
        if self.step_rule and not decision.fixed:
            plan = self._with_vote(plan, o)
        planned = PlannedRequest(self, plan, prompt_tokens)
        return planned.without_speculation(unserved) if unserved else planned

    def _with_vote(self, plan: Plan, o: ControlOverrides | None) -> Plan:
        """The plan with its class's vote for the engine's step rule: the class's live
        p_1..p_K, the plane's probe depth where it explores, bound by K and the flags.

        A request at k = 0 (its class's own depth at its load, or a probe of depth 0)
        rides (`StepVote.rides`): it has no say in a step's depth and keeps no drafter
        running (a voter may draft in a later step, so every step it is in keeps the
        drafter, which a step without voters skips, `engine/vllm/draft_skip.py`; a probe
        of 0 is there to time such a step), but where voters set a depth it verifies it,
        as its drafts then cost the step nothing more; it runs at k = 0 for good once a
        step skips the drafter (its drafter KV has a gap)."""
        controller = self.controller
        decision = plan.decision
        acceptance = controller.acceptance_of(plan.class_id)
        if decision is None or not acceptance or (o is not None and not o.enabled):
            return plan
        bound = controller.settings.max_k if o is None else min(o.k_max, controller.settings.max_k)
        if bound <= 0:
            return plan
        probe = decision.k if decision.explored else 0
        anchor = min(bound, self.class_choice(decision))
        vote = StepVote(acceptance, probe, plan.class_id, decision.k == 0, anchor)
        step = StepArgs(vote, controller.cost_model.step_table(), self._news(plan.class_id))
        return plan._replace(step=step, bound=bound)

    def class_choice(self, decision: SpeculationDecision) -> int:
        """The depth a decision's class chose at its load (`Controller.class_depth`):
        what a probe replaced or a batch rule held it below or let it ride above; a
        pinned or static decision's own k, as is a class's before its first choice."""
        if decision.fixed:
            return decision.k
        chosen = self.controller.class_depth(decision.class_id, decision.bucket)
        return decision.k if chosen is None else chosen

    def _news(self, class_id: str) -> dict[str, tuple[float, ...]]:
        """The estimates of the other classes in flight that moved since last sent (the
        controller replaces a class's estimates when they move, never mutates them).
        Sent means entered the engine (`_enter`): a request refused before then leaves
        them to the next one."""
        news = {}
        sent = self._sent
        for other in self._voting:
            if other != class_id:
                p = self.controller.acceptance_of(other)
                if p is not None and p is not sent.get(other):
                    news[other] = p
        return news

    def plan_chat(
        self,
        view: ChatView,
        prompt_tokens: int,
        *,
        running: int,
        queued: int = 0,
        sampling: str = "",
        unserved: str = "",
    ) -> PlannedRequest:
        """A chat-shaped request as classification reads it (`ChatView`); `sampling`: ""
        when greedy, else its temperature's bucket (`features.sampling_bucket`);
        `unserved`: see `plan_features`."""
        features = features_from_chat(
            view.messages,
            view.tools,
            view.tool_choice,
            view.response_format,
            prompt_tokens,
            self._identities,
            sampling,
        )
        load = self.load(running, queued)
        return self.plan_features(features, prompt_tokens, load, unserved)

    def plan_completion(
        self,
        prompt: str,
        prompt_tokens: int,
        *,
        running: int,
        queued: int = 0,
        sampling: str = "",
        unserved: str = "",
    ) -> PlannedRequest:
        features = features_from_completion(prompt, prompt_tokens, self._identities, sampling)
        load = self.load(running, queued)
        return self.plan_features(features, prompt_tokens, load, unserved)

    # ---- the request's life in the batch ---------------------------------------------
    def _enter(self, plan: Plan, prompt_tokens: int) -> Ticket:
        step = plan.step
        if step is not None and not step.vote.rides:
            self._voting[plan.class_id] = self._voting.get(plan.class_id, 0) + 1
            self._sent[plan.class_id] = step.vote.acceptance
            for other, acceptance in step.news.items():
                if other in self._voting:
                    self._sent[other] = acceptance
        batch = self.batch
        if plan.cap is not None:
            batch.cap(plan.cap)  # what the engine does as the request is added
        return batch.enter(plan.k, plan.gains, prompt_tokens, plan.floor, plan.anchor, plan.fixed)

    def _finish(self, plan: Plan, ticket: Ticket, outcome: RequestOutcome | None) -> BatchMeans:
        if plan.step is not None and not plan.step.vote.rides:
            left = self._voting.get(plan.class_id, 1) - 1
            if left > 0:
                self._voting[plan.class_id] = left
            else:
                self._voting.pop(plan.class_id, None)
                self._sent.pop(plan.class_id, None)
        ran_in = self.batch.leave(ticket)
        if outcome is not None and plan.cls is not None and plan.decision is not None:
            # The batch it ran in (means over its life), not the one at its end.
            load = LoadSnapshot(
                running=max(round(ran_in.size) - 1, 0),
                depth=ran_in.depth,
                prefill=ran_in.prefill,
            )
            self.controller.observe(plan.cls, plan.decision, outcome, load)
        return ran_in

    def observe_step(self, step: EngineStep) -> bool:
        """One timed engine step to the cost model, if its batch is the one in flight.

        The step's cost is its batch's: how many requests, at which depth (the
        deepest request's, `BatchLoad.deepest`). When the engine's decoding requests
        and their scheduled tokens (1 + k each) are exactly the requests in flight,
        the step ran at that depth; steps that also prefilled (a first token's cost,
        not a decode step's) and steps around a request's entry or exit do not match
        and are not filed. Returns whether the step was filed.
        """
        batch = self.batch
        if self.step_rule:
            return self._observe_voted_step(step)
        filed = batch.in_flight > 0 and step.decoded_only(batch.in_flight, batch.step_tokens())
        if filed:
            self.controller.observe_step(step.decode_requests, batch.deepest, step.seconds)
        return filed

    def _observe_voted_step(self, step: EngineStep) -> bool:
        """With the step rule the engine picks the depth: a decode-only step of the
        requests in flight in which each verified the same d drafts ran at depth d; at
        d = 0 with voters in it, the rule held it there (`CostModel.observe_held_step`)."""
        depth = step.common_depth()
        if (
            depth is None
            or step.prefill_requests > 0
            or step.decode_requests != self.batch.in_flight
        ):
            return False
        if depth == 0 and self._voting:
            # held at 0 for voters who may draft later: not a step the drafter skips
            self.controller.observe_held_step(step.decode_requests, step.seconds)
        else:
            self.controller.observe_step(step.decode_requests, depth, step.seconds)
        return True
