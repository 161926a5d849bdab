"""ControlPlane with the step rule on: what a request sends the engine (its class's vote,
the step costs, k as a bound) and how the engine's steps are filed."""

from __future__ import annotations

import random

import pytest

from engine.interface import EngineStep
from engine.step_rule import SPEC_COSTS_ARG, SPEC_VOTE_ARG
from gateway.control.controller import Controller
from gateway.control.cost_held import HELD_MIN_STEPS, HeldSteps
from gateway.control.decision import ControlOverrides
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControllerSettings
from gateway.runtime import step_rule_on
from tests.control.test_plane import CHAT, TOOLS, Clock, outcome

K = 4


def _plane(overrides: ControlOverrides | None = None, step_rule: bool = True) -> ControlPlane:
    clock = Clock()
    settings = ControllerSettings(max_k=K)
    controller = Controller(settings, max_depth=K, rng=random.Random(0), clock=clock)
    return ControlPlane(
        controller, overrides=lambda c, lbl: overrides, clock=clock, step_rule=step_rule
    )


def test_a_voter_sends_its_class_estimates_and_the_costs_with_k_as_a_bound() -> None:
    plane = _plane()
    planned = plane.plan_chat(CHAT, 100, running=0)
    step = planned.step
    assert step is not None
    assert step.vote.acceptance == plane.controller.acceptance_of(planned.class_id)
    assert len(step.vote.acceptance) == K
    assert step.costs is plane.controller.cost_model.step_table()
    assert planned.engine_k == K  # the bound; the plan's own k is still the decision's
    args = step.extra_args()
    assert set(args) == {SPEC_VOTE_ARG, SPEC_COSTS_ARG}
    assert args[SPEC_COSTS_ARG]["buckets"][0] == 1


def test_a_vote_anchors_at_its_class_choice_not_at_a_probe() -> None:
    """The vote's anchor is the depth its class chose at the load (with the
    controller's hysteresis), which a probe does not replace, bound by the flags."""
    clock = Clock()
    settings = ControllerSettings(max_k=K, default_k=2, exploration_share=1.0)
    controller = Controller(settings, max_depth=K, rng=random.Random(0), clock=clock)
    plane = ControlPlane(controller, overrides=lambda c, lbl: None, clock=clock, step_rule=True)
    probes = 0
    for _ in range(40):
        planned = plane.plan_chat(CHAT, 100, running=0)
        decision = planned.plan.decision
        assert decision is not None
        assert planned.step is not None
        chosen = controller.class_depth(planned.class_id, decision.bucket)
        assert chosen == 2
        assert plane.class_choice(decision) == chosen
        assert planned.step.vote.anchor == chosen
        probes += decision.explored and decision.k != chosen
    assert probes > 0
    bounded = _plane(ControlOverrides(k_max=1)).plan_chat(CHAT, 100, running=0)
    assert bounded.step is not None
    assert bounded.step.vote.anchor <= 1


def test_the_flags_bound_a_voter_and_an_operators_k_is_not_a_vote() -> None:
    bounded = _plane(ControlOverrides(k_max=2)).plan_chat(CHAT, 100, running=0)
    assert bounded.step is not None
    assert bounded.engine_k == 2
    pinned = _plane(ControlOverrides(pin_k=3)).plan_chat(CHAT, 100, running=0)
    assert pinned.step is None
    assert pinned.engine_k == 3
    assert pinned.plan.decision is not None
    assert pinned.plan.decision.k == 3
    static = _plane(ControlOverrides(mode="static")).plan_chat(CHAT, 100, running=0)
    assert static.step is None
    off = _plane(ControlOverrides(enabled=False)).plan_chat(CHAT, 100, running=0)
    assert off.step is None
    assert off.engine_k == 0


def test_without_speculation_drops_the_vote() -> None:
    planned = _plane().plan_chat(CHAT, 100, running=0)
    zero = planned.without_speculation("sampled-not-exact")
    assert zero.step is None
    assert zero.engine_k == 0
    unserved = _plane().plan_chat(CHAT, 100, running=0, unserved="logit_bias")
    assert unserved.step is None
    assert unserved.engine_k == 0


def test_a_class_at_zero_rides_without_a_say_in_the_steps_depth() -> None:
    """A class whose own depth at its load is 0 keeps k = 0 as its depth and sends a
    rider's vote (`StepVote.rides`), bound by K: no say in a step's depth and no drafter
    kept for it, but where voters set a depth it verifies it; a probe of a deeper depth
    still votes."""
    clock = Clock()
    settings = ControllerSettings(
        max_k=K, default_k=0, exploration_share=0.0, zero_probe_share=0.0, cost_probe_share=0.0
    )
    controller = Controller(settings, max_depth=K, rng=random.Random(0), clock=clock)
    plane = ControlPlane(controller, overrides=lambda c, lbl: None, clock=clock, step_rule=True)
    planned = plane.plan_chat(CHAT, 100, running=0)
    assert planned.plan.decision is not None
    assert not planned.plan.decision.explored
    assert (planned.k, planned.engine_k) == (0, K)
    assert planned.step is not None
    assert planned.step.vote.rides
    assert planned.step.vote.probe == 0
    assert planned.step.vote.acceptance == controller.acceptance_of(planned.class_id)
    probing = ControllerSettings(max_k=K, default_k=0, zero_probe_share=1.0)
    controller = Controller(probing, max_depth=K, rng=random.Random(0), clock=clock)
    plane = ControlPlane(controller, overrides=lambda c, lbl: None, clock=clock, step_rule=True)
    probe = plane.plan_chat(CHAT, 100, running=0)
    assert probe.plan.decision is not None
    assert probe.plan.decision.explored
    assert probe.step is not None
    assert probe.step.vote.probe == probe.k > 0
    assert probe.engine_k == K


def test_a_probe_of_depth_zero_rides() -> None:
    """A probe at k = 0 is there to time the step no request drafts in: it rides, which
    keeps no drafter running (a step of riders alone skips it). Probes of deeper depths
    vote, at their depth."""
    clock = Clock()
    settings = ControllerSettings(max_k=K, default_k=1, exploration_share=1.0)
    controller = Controller(settings, max_depth=K, rng=random.Random(0), clock=clock)
    plane = ControlPlane(controller, overrides=lambda c, lbl: None, clock=clock, step_rule=True)
    seen = set()
    for _ in range(40):
        planned = plane.plan_chat(CHAT, 100, running=0)
        decision = planned.plan.decision
        assert decision is not None
        if decision.explored:
            seen.add(planned.k > 0)
            assert planned.step is not None
            assert planned.step.vote.rides is (planned.k == 0)
            assert planned.step.vote.probe == planned.k
    assert seen == {False, True}


def test_off_by_default() -> None:
    planned = _plane(step_rule=False).plan_chat(CHAT, 100, running=0)
    assert planned.step is None
    assert planned.engine_k == planned.k


class _Engine:
    def __init__(self, max_depth: int, uniform: bool) -> None:
        self.max_depth = max_depth
        self.one_depth_per_step = uniform


@pytest.mark.parametrize(
    ("setting", "max_depth", "uniform", "on"),
    [
        ("auto", 4, True, True),
        ("auto", 4, False, False),
        ("auto", 0, True, False),
        ("on", 4, False, True),
        ("off", 4, True, False),
    ],
)
def test_auto_follows_the_engine(setting: str, max_depth: int, uniform: bool, on: bool) -> None:
    settings = ControllerSettings.model_validate({"step_rule": setting})
    assert step_rule_on(settings, _Engine(max_depth, uniform)) is on  # type: ignore[arg-type]
    assert ControllerSettings().step_rule == "auto"


def test_the_cost_table_is_rebuilt_only_when_a_bucket_moves() -> None:
    model = _plane().controller.cost_model
    first = model.step_table()
    assert model.step_table() is first
    for _ in range(40):
        model.observe_step(4, 3, 0.05)
        model.observe_step(4, 0, 0.02)
    assert model.step_table() is not first
    assert model.step_table().costs(4, False) == model.relative_costs(4)


def _filed(plane: ControlPlane, bucket: int) -> list[float]:
    """The forgetting weight of step times filed at each depth of `bucket`."""
    for row in plane.controller.cost_model.report():
        filed = row["filed"]
        if row["batch_bucket"] == bucket and isinstance(filed, list):
            return [float(x) for x in filed]
    return [0.0] * (K + 1)


def test_an_engine_step_is_filed_at_the_depth_every_request_verified() -> None:
    plane = _plane()
    for running in range(3):
        plane.plan_chat(CHAT, 100, running=running).enter()
    before = _filed(plane, 4)
    assert plane.observe_step(EngineStep(0.03, 3, 3 * (1 + 2)))  # 3 requests at depth 2
    after = _filed(plane, 4)
    assert after[2] > before[2]
    assert [a for d, a in enumerate(after) if d != 2] == [b for d, b in enumerate(before) if d != 2]
    assert not plane.observe_step(EngineStep(0.03, 3, 3 + 4))  # depths differ: not one d
    assert not plane.observe_step(EngineStep(0.03, 2, 2 * 3))  # not the batch in flight
    assert not plane.observe_step(EngineStep(0.03, 3, 9, prefill_requests=1))


def test_a_step_held_at_zero_with_voters_is_filed_apart_and_prices_the_rules_hold() -> None:
    """A depth-0 step with voters in it kept the drafter (a voter may draft later), so it
    is not the step at k = 0 the classes decide on: it is filed apart, and the table the
    engine's rule reads prices holding at 0 by it once the bucket has HELD_MIN_STEPS."""
    plane = _plane()
    voters = [plane.plan_chat(CHAT, 100, running=running) for running in range(3)]
    assert all(v.step is not None for v in voters)
    for v in voters:
        v.enter()
    model = plane.controller.cost_model
    idle = model.relative_costs(4)
    before = _filed(plane, 4)
    for n in range(HELD_MIN_STEPS):
        assert model.held_cost(4) is None, n
        assert plane.observe_step(EngineStep(0.05, 3, 3))  # all verified 0: held
    assert _filed(plane, 4) == before  # no depth of the bucket moved
    assert model.relative_costs(4) == idle
    held = model.held_cost(4)
    assert held is not None
    assert held == pytest.approx(0.05 / model._steps.step_zero(4))
    assert model.step_table().costs(4, False) == (held, *idle[1:])
    assert held > 1.0
    # once no voter is in flight, a depth-0 step is the step the drafter skips
    for v in voters:
        v.finish(None)
    quiet = plane.plan_chat(TOOLS, 100, running=0, unserved="logit_bias")
    assert quiet.step is None
    quiet.enter()
    assert plane.observe_step(EngineStep(0.01, 1, 1))
    assert _filed(plane, 1)[0] > 0


def test_held_steps_keep_a_forgetting_mean_per_bucket() -> None:
    steps = HeldSteps(forgetting=0.5)
    for seconds in (1.0, 1.0, 1.0):
        steps.file(8, seconds)
    assert steps.mean(8) is None  # fewer than HELD_MIN_STEPS
    steps.file(8, 3.0)
    # weights 1/8, 1/4, 1/2, 1 on 1, 1, 1, 3
    assert steps.mean(8) == pytest.approx((0.125 + 0.25 + 0.5 + 3.0) / 1.875)
    steps.file(8, 0.0)  # not a time
    assert steps.mean(8) == pytest.approx((0.125 + 0.25 + 0.5 + 3.0) / 1.875)
    assert steps.mean(16) is None


def test_a_voter_brings_the_newer_estimates_of_the_other_classes_in_flight() -> None:
    plane = _plane()
    chat = plane.plan_chat(CHAT, 100, running=0)
    assert chat.step is not None
    assert chat.step.vote.class_id == chat.class_id
    chat.enter()
    learner = plane.plan_chat(CHAT, 100, running=1)
    learner.enter()
    learner.finish(outcome(3, steps=10, accepted=0))  # chat's estimates move
    moved = plane.controller.acceptance_of(chat.class_id)
    assert moved != chat.step.vote.acceptance
    refused = plane.plan_chat(TOOLS, 100, running=1)  # planned, never entered
    assert refused.step is not None
    assert refused.step.news == {chat.class_id: moved}
    refused.finish(None)
    tools = plane.plan_chat(TOOLS, 100, running=1)
    assert tools.step is not None
    assert tools.step.news == {chat.class_id: moved}  # the refused one never sent it
    tools.enter()
    again = plane.plan_chat(TOOLS, 100, running=2)
    assert again.step is not None
    assert again.step.news == {}  # sent once
    chat.finish(None)
    learner2 = plane.plan_chat(CHAT, 100, running=0)
    learner2.enter()
    learner2.finish(outcome(3, steps=10, accepted=30))
    late = plane.plan_chat(TOOLS, 100, running=0)
    assert late.step is not None
    assert late.step.news == {}  # chat no longer in flight


def test_a_pinned_requests_choice_is_its_pin_not_its_classs() -> None:
    """`ControlPlane.class_choice`: an operator's k stands for the request's class
    choice (the twin's settling figures, the vote's anchor), whatever the class chose."""
    flags: list[ControlOverrides | None] = [None]
    clock = Clock()
    settings = ControllerSettings(max_k=K, default_k=2, exploration_share=0.0)
    controller = Controller(settings, max_depth=K, rng=random.Random(0), clock=clock)
    plane = ControlPlane(controller, overrides=lambda c, lbl: flags[0], clock=clock, step_rule=True)
    free = plane.plan_chat(CHAT, 100, running=0).plan.decision
    assert free is not None
    assert plane.class_choice(free) == controller.class_depth(free.class_id, free.bucket) == 2
    flags[0] = ControlOverrides(pin_k=4)
    pinned = plane.plan_chat(CHAT, 100, running=0).plan.decision
    assert pinned is not None
    assert pinned.fixed
    assert controller.class_depth(pinned.class_id, pinned.bucket) == 2
    assert plane.class_choice(pinned) == 4
