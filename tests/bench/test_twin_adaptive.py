"""The twin's adaptive mode decides nothing itself: a fresh control plane, fed the same
requests, steps and outcomes at the same virtual times, gives the same depths and caps.

A twin that re-implemented any decision rule (or altered the plane's answer) ran
depths the plane did not give, and the replay below tells them apart: the negative
control shows the test failing on one such change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from bench.twin.costs import StepCosts
from bench.twin.engine import MAX_RUNNING, Plan, VirtualClock, simulate
from bench.twin.modes.adaptive import AdaptiveControl, Trace, build_plane, plan_request
from bench.twin.requests import TwinRequest, build_requests
from bench.twin.runner import check_classes, scaled
from bench.twin.schema import TwinInputError, Workload, load_profile, load_workload
from gateway.control.features import ChatView
from gateway.control.plane import ControlPlane, PlannedRequest
from gateway.control.settings import ControllerSettings

FIXTURES = Path(__file__).parent / "twin_fixtures"
SEED = 11


def _inputs() -> tuple[StepCosts, Workload, list[TwinRequest]]:
    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 240)
    return StepCosts.of(profile, MAX_RUNNING), workload, build_requests(workload, SEED)


def _record(source_type: type[AdaptiveControl], clients: int) -> Trace:
    costs, workload, requests = _inputs()
    trace = Trace()
    clock = VirtualClock()
    source = source_type(workload, costs, clock, SEED, trace=trace)
    simulate(requests, source, costs, clock, clients=clients)
    return trace


def replay(
    trace: Trace, on_plan: Callable[[ControlPlane, int, PlannedRequest], None] | None = None
) -> dict[int, tuple[int, int | None]]:
    """The trace's calls through a fresh, identically built plane: request -> (k, cap);
    `on_plan` sees each request as it is planned, before the rest of the trace moves on."""
    costs, _, _ = _inputs()
    clock = VirtualClock()
    plane = build_plane(costs, clock, SEED)
    planned: dict[int, PlannedRequest] = {}
    for event in trace.events:
        kind, clock.now = event[0], event[1]
        if kind == "plan":
            _, _, index, endpoint, body, prompt, running, queued, sampling = event
            planned[index] = plan_request(plane, endpoint, body, prompt, running, queued, sampling)
            if on_plan is not None:
                on_plan(plane, index, planned[index])
        elif kind == "enter":
            planned[event[2]].enter()
        elif kind == "step":
            plane.observe_step(event[2])
        else:
            planned[event[2]].finish(event[3])
    return {index: (p.k, p.cap) for index, p in sorted(planned.items())}


def _ran(trace: Trace) -> dict[int, tuple[int, int | None]]:
    """request -> (k, cap) the twin's engine applied as it admitted the request."""
    return {e[2]: (e[3], e[4]) for e in trace.events if e[0] == "enter"}


@pytest.mark.parametrize("clients", [1, 8])
def test_a_fresh_plane_replays_the_twins_depths_exactly(clients: int) -> None:
    trace = _record(AdaptiveControl, clients)
    ran = _ran(trace)
    assert len(ran) == 240
    assert len({k for k, _ in ran.values()}) > 1  # the depths moved: the test has teeth
    assert replay(trace) == ran


def test_a_record_counts_at_its_classs_choice_not_at_the_depth_the_batch_fitted() -> None:
    """`RequestRecord.chosen`, the settling figures' depth, is what the replayed plane's
    class chose at the request's load, also where a batch rule or a probe set another k."""
    costs, workload, requests = _inputs()
    trace = Trace()
    clock = VirtualClock()
    source = AdaptiveControl(workload, costs, clock, SEED, trace=trace)
    records = simulate(requests, source, costs, clock, clients=8).records
    chosen: dict[int, int] = {}

    def class_depth(plane: ControlPlane, index: int, planned: PlannedRequest) -> None:
        decision = planned.plan.decision
        assert decision is not None
        depth = plane.controller.class_depth(decision.class_id, decision.bucket)
        assert depth is not None
        chosen[index] = depth

    replay(trace, class_depth)
    assert {r.index: r.chosen for r in records} == chosen
    # Some ran at another depth than their class chose: the test has teeth.
    assert any(r.k != r.chosen for r in records)


class _ShallowTwin(AdaptiveControl):
    """A twin with a rule of its own: never deeper than 2 (what the test must catch)."""

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        plan = super().arrive(request, running, queued)
        return plan._replace(k=min(plan.k, 2))


def test_replay_catches_a_rule_reimplemented_in_the_twin() -> None:
    trace = _record(_ShallowTwin, 1)
    assert replay(trace) != _ran(trace)


def test_check_classes_names_two_workload_classes_that_look_alike() -> None:
    workload = load_workload(FIXTURES / "workload_small.json")
    twin = workload.classes["chat"].model_copy()
    clash = workload.model_copy(update={"classes": {**workload.classes, "chat2": twin}})
    phases = [p.model_copy(update={"mix": {"chat": 0.5, "chat2": 0.5}}) for p in clash.phases]
    clash = clash.model_copy(update={"phases": phases})
    with pytest.raises(TwinInputError, match="'chat' and 'chat2'"):
        check_classes(clash, build_requests(clash, 1))


@pytest.mark.parametrize("uniform", [False, True])
def test_adaptive_keeps_the_gateways_default_floor_for_the_profiles_engine(uniform: bool) -> None:
    """`adaptive` is the gateway with its defaults: the `batch-floor` default the gateway
    resolves for an engine that verifies one depth per step (a uniform profile) or each
    request's own (`ControllerSettings.batch_floor_for`); `adaptive-floor` sets it."""
    costs, _, _ = _inputs()
    costs = dataclasses.replace(costs, uniform=uniform)
    body = ChatView([{"role": "user", "content": "Name three rivers."}])
    expected = ControllerSettings().batch_floor_for(one_depth_per_step=uniform)
    default = build_plane(costs, VirtualClock(), SEED).plan_chat(body, 8, running=0)
    assert default.plan.floor == expected
    assert (expected > 0) != uniform
    floored = build_plane(costs, VirtualClock(), SEED, floor=0.5).plan_chat(body, 8, running=0)
    assert floored.plan.floor == 0.5
