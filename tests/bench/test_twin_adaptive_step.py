"""The per-step depth mode: deterministic, one depth per step from the controller's live
estimates, and learning acceptance online from the steps it ran."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.twin.costs import StepCosts
from bench.twin.engine import MAX_RUNNING, VirtualClock, simulate
from bench.twin.modes import ADAPTIVE_STEP, ADAPTIVE_STEP_FREE, NOSPEC, ORACLE, static_modes
from bench.twin.modes.adaptive import Trace
from bench.twin.modes.adaptive_step import AdaptiveStep
from bench.twin.requests import build_requests
from bench.twin.runner import Case, run_case, scaled
from bench.twin.schema import load_profile, load_workload
from bench.twin.summary import build_summary
from engine.interface import EngineStep
from engine.step_rule import (
    GUARD,
    RETIRE_AFTER,
    StepArgs,
    StepCostTable,
    StepVote,
    vote_step_depth,
)
from gateway.control.settings import ControllerSettings

FIXTURES = Path(__file__).parent / "twin_fixtures"
SEED = 11


def _summary_text(seed: int) -> str:
    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 120)
    modes = [*static_modes(profile.max_k), ADAPTIVE_STEP, ADAPTIVE_STEP_FREE]
    run = run_case(Case(profile, workload, step_noise=0.05), [seed], modes=modes)
    return json.dumps(build_summary([run], [seed]), indent=1, sort_keys=True)


def test_one_seed_gives_a_byte_identical_summary() -> None:
    first = _summary_text(SEED)
    assert first == _summary_text(SEED)
    assert first != _summary_text(SEED + 1)
    cell = json.loads(first)["profiles"]["test-h100-like"]["arrivals"]["c8"]
    assert {ADAPTIVE_STEP, ADAPTIVE_STEP_FREE, NOSPEC} <= set(cell["tokens_per_s"])


def _run(clients: int) -> tuple[AdaptiveStep, Trace]:
    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 240)
    costs = StepCosts.of(profile, MAX_RUNNING)
    clock = VirtualClock()
    trace = Trace()
    source = AdaptiveStep(workload, costs, clock, SEED, trace=trace)
    simulate(build_requests(workload, SEED), source, costs, clock, clients=clients)
    return source, trace


def test_every_step_verifies_one_depth_for_its_whole_batch() -> None:
    _, trace = _run(8)
    steps = [e[2] for e in trace.events if e[0] == "step" and e[2].decode_requests]
    assert steps
    depths = set()
    for step in steps:
        drafts = step.decode_tokens - step.decode_requests
        assert drafts % step.decode_requests == 0  # every request at the step's depth
        depths.add(drafts // step.decode_requests)
    assert len(depths) > 1  # the depth follows the batch


def test_the_controller_learns_acceptance_from_the_steps_it_ran() -> None:
    source, trace = _run(4)
    prior = ControllerSettings().prior_accept
    outcomes = [e[3] for e in trace.events if e[0] == "finish" and e[3] is not None]
    # Outcomes carry every position a request verified, deeper than its class's vote too.
    assert any(len(o.speculation.accepted_per_position) > o.speculation.k for o in outcomes)
    controller = source.plane.controller
    estimates = [controller.acceptance_of(r.class_id) for r in controller.snapshot()]
    p1 = sorted(e[0] for e in estimates if e)
    # The fixture's classes accept 0.3 (tools), 0.85 (chat), 0.9 (code) at position 1.
    assert p1[0] < prior - 0.25
    assert p1[-1] > prior + 0.1


def test_a_request_alone_in_its_steps_verifies_what_it_asked_for() -> None:
    """At c1 each step holds one request: it verifies the depth the rule gives its class
    alone, or a deeper probe of the plane's exploration (`vote_step_depth`'s probe rule,
    `tests/engine/test_step_rule.py`), in every step; a probe of depth 0 sends no vote
    and verifies none (`ControlPlane._with_vote`)."""
    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 240)
    costs = StepCosts.of(profile, MAX_RUNNING)
    clock = VirtualClock()
    source = AdaptiveStep(workload, costs, clock, SEED)
    result = simulate(build_requests(workload, SEED), source, costs, clock, clients=1)
    assert all(r.k >= r.chosen or r.k == 0 for r in result.records)
    assert any(r.k >= r.chosen > 0 for r in result.records)
    assert len({r.k for r in result.records}) > 1
    for r in result.records:
        assert r.draft_tokens == r.k * r.verify_steps


def test_where_nothing_gains_from_drafting_the_gateways_engine_skips_the_drafter() -> None:
    """The oracle puts every class at k = 0; on the gateway's engine
    (`StepCosts.on_gateway`: no request drafts, so the drafter is skipped) that runs
    exactly as an engine without a drafter, while the profile's own static k = 0 pays
    the drafter's KV pass in every step. With the step rule, classes whose own depth
    falls to 0 stop voting, so their steps skip the drafter too and beat static k = 0
    (were they still voting, each step held at 0 would keep the pass)."""
    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 200)
    hopeless = {
        name: spec.model_copy(update={"acceptance": [0.0] * len(spec.acceptance)})
        for name, spec in workload.classes.items()
    }
    workload = workload.model_copy(update={"classes": hopeless})
    modes = [*static_modes(profile.max_k), ADAPTIVE_STEP, ORACLE]
    run = run_case(Case(profile, workload), [SEED], modes=modes)
    for label, seeds in run.cells.items():
        speed = {mode: cell["tokens_per_s"] for mode, cell in seeds[SEED].items()}
        assert speed[ORACLE] == speed[NOSPEC], label
        assert speed["static-k0"] < speed[NOSPEC], label
        assert speed["static-k0"] < speed[ADAPTIVE_STEP], label
        # At a Poisson rate a run whose early steps were slower (held, before its voters
        # retire) batches more later and may end its tail sooner: within 0.1 % of no
        # speculation, never above it by more.
        assert speed[ADAPTIVE_STEP] <= speed[NOSPEC] * (1 + 1e-3), label


def test_a_voter_held_at_zero_long_enough_retires_as_in_the_engine() -> None:
    """The engine's retirement (`engine.vllm.step_votes`, `RETIRE_AFTER`) in the twin: a
    strong voter beside three requests without votes is held at depth 0, each held step
    keeping the drafter for it; after `RETIRE_AFTER` of them it verifies none and the
    steps are ones no request drafts in, until it finishes."""
    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 20)
    costs = StepCosts.of(profile, MAX_RUNNING)
    source = AdaptiveStep(workload, costs, VirtualClock(), SEED)
    table = StepCostTable((1, 64), ((1.0, 1.5, 2.0, 2.5, 3.0),) * 2, ((), ()))
    vote = StepVote((0.9, 0.85, 0.8, 0.75), class_id="strong")
    source._table = table

    def live(index: int, step: StepArgs | None) -> Any:
        planned = SimpleNamespace(step=step, finish=lambda outcome: None)
        return SimpleNamespace(plan=SimpleNamespace(handle=(index, planned)))

    voter = live(0, StepArgs(vote, table))
    batch = [voter, live(1, None), live(2, None), live(3, None)]
    held = []
    for _ in range(RETIRE_AFTER + 2):
        assert source.step_depth(len(batch), batch) == 0
        held.append(source.drafts_once_at_zero)
    assert held == [True] * (RETIRE_AFTER - 1) + [False] * 3
    assert not source.drafts(voter)
    source.finish(voter.plan, None)
    assert source.drafts(voter)  # the index is free for the next request


def test_a_rider_verifies_its_voters_depth_until_a_step_skips_the_drafter() -> None:
    """The engine's riders (`engine.vllm.step_votes`) in the twin: a request at k = 0 with
    a rider's vote verifies the depth a strong voter sets (its weak class no longer holds
    the step lower, as a request without a vote would); a step without voters skips the
    drafter, and from then on it verifies none, voters or not."""
    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 20)
    costs = StepCosts.of(profile, MAX_RUNNING)
    source = AdaptiveStep(workload, costs, VirtualClock(), SEED)
    table = StepCostTable((1, 64), ((1.0, 1.3, 1.6, 1.9, 2.2),) * 2, ((), ()))
    source._table = table
    strong = StepVote((0.9, 0.85, 0.8, 0.75), class_id="chat")
    weak = StepVote((0.2, 0.1, 0.1, 0.1), class_id="tools", rides=True)

    def live(index: int, step: StepArgs | None) -> Any:
        planned = SimpleNamespace(step=step, finish=lambda outcome: None)
        return SimpleNamespace(plan=SimpleNamespace(handle=(index, planned)), pos=1)

    voter = live(0, StepArgs(strong, table))
    riders = [live(i, StepArgs(weak, table)) for i in (1, 2, 3)]
    plain = [live(i, None) for i in (1, 2, 3)]
    assert source.step_depth(4, [voter, *plain]) == 0
    assert source.step_depth(4, [voter, *riders]) > 0
    assert all(source.drafts(r) for r in riders)
    source.observe_step(EngineStep(0.01, 4, 4))
    alone = riders[:1]
    assert source.step_depth(1, alone) == 0
    assert not source.drafts_once_at_zero  # no voter: the drafter is skipped
    source.observe_step(EngineStep(0.01, 1, 1))
    assert source.step_depth(2, [voter, *alone]) > 0
    assert not source.drafts(alone[0])  # its drafter KV has a gap
    assert source.drafts(riders[1])


def test_a_request_a_batch_rule_held_at_zero_keeps_its_classs_choice() -> None:
    """Held at 0 by a batch rule (`BatchDepth.fit`), a request rides, but its record's
    choice is the depth its class's vote gets alone (what settling reads), not 0."""
    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 240)
    costs = StepCosts.of(profile, MAX_RUNNING)
    clock = VirtualClock()
    source = AdaptiveStep(workload, costs, clock, SEED)
    held: list[tuple[int, int]] = []
    arrive = source.arrive

    def watch(request: Any, running: int, queued: int) -> Any:
        plan = arrive(request, running, queued)
        step = plan.handle[1].step
        if step is not None and step.vote.rides and plan.handle[1].reason.startswith("batch:"):
            vote = replace(step.vote, probe=0, rides=False)
            alone = vote_step_depth([vote], step.costs, running + 1, False, None, GUARD)
            held.append((plan.chosen, alone))
        return plan

    source.arrive = watch  # type: ignore[method-assign]
    # At 32 the fixture's batch rules hold most arrivals at 0 (its step costs grow dear).
    result = simulate(build_requests(workload, SEED), source, costs, clock, clients=32)
    assert held
    assert all(chosen == alone for chosen, alone in held)
    assert any(alone > 0 for _, alone in held)
    assert any(r.chosen > r.k for r in result.records)


def test_a_probe_is_not_its_classs_choice() -> None:
    """A probe of the plane's exploration runs its step at the probe's depth when alone
    in it, but its record's choice is the depth its class's vote gets without the probe:
    settling reads the class's learning, not its exploration."""
    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 240)
    costs = StepCosts.of(profile, MAX_RUNNING)
    clock = VirtualClock()
    source = AdaptiveStep(workload, costs, clock, SEED)
    probes: list[tuple[int, int, int]] = []
    arrive = source.arrive

    def watch(request: Any, running: int, queued: int) -> Any:
        plan = arrive(request, running, queued)
        step = plan.handle[1].step
        if step is not None and step.vote.probe > 0 and not step.vote.rides:
            vote = replace(step.vote, probe=0)
            alone = vote_step_depth([vote], step.costs, running + 1, False, None, GUARD)
            probes.append((plan.k, plan.chosen, alone))
        return plan

    source.arrive = watch  # type: ignore[method-assign]
    simulate(build_requests(workload, SEED), source, costs, clock, clients=1)
    assert probes
    assert all(chosen == alone for _, chosen, alone in probes)
    assert any(k > chosen for k, chosen, _ in probes)
