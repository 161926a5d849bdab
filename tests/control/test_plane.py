"""ControlPlane: a request's plan and its life in the batch, on the real controller."""

from __future__ import annotations

import random

import pytest

from engine.interface import EngineStep, RequestOutcome, SpeculationOutcome
from gateway.control.controller import Controller
from gateway.control.decision import ControlOverrides
from gateway.control.features import SAMPLED_NOT_EXACT, ChatView, unserved_by_drafts
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControllerSettings

CHAT = ChatView([{"role": "user", "content": "Tell me about the sea."}])
TOOLS = ChatView(
    [{"role": "user", "content": "Weather in Paris?"}],
    [{"type": "function", "function": {"name": "weather", "parameters": {}}}],
    "auto",
)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def plane_with(overrides: ControlOverrides | None = None) -> tuple[ControlPlane, Clock]:
    clock = Clock()
    controller = Controller(ControllerSettings(), max_depth=3, rng=random.Random(0), clock=clock)
    return ControlPlane(controller, overrides=lambda c, lbl: overrides, clock=clock), clock


def outcome(k: int, steps: int = 10, accepted: int = 12) -> RequestOutcome:
    spec = SpeculationOutcome(k, steps, k * steps, accepted if k else 0)
    return RequestOutcome("r", 100, steps + (accepted if k else 0), "length", spec)


def test_distinct_bodies_get_distinct_classes_and_headers_say_so() -> None:
    plane, _ = plane_with()
    chat = plane.plan_chat(CHAT, 100, running=0)
    tools = plane.plan_chat(TOOLS, 100, running=0)
    assert chat.class_id != tools.class_id
    assert chat.headers() == {"x-specgw-class": chat.label, "x-specgw-k": str(chat.k)}


def test_a_pin_reaches_the_plan_and_the_batch_tracks_the_request() -> None:
    plane, clock = plane_with(ControlOverrides(pin_k=2))
    planned = plane.plan_chat(CHAT, 100, running=0)
    assert (planned.k, planned.reason) == (2, "pinned")
    assert plane.batch.in_flight == 0
    planned.enter()
    planned.enter()  # idempotent: entered once
    assert (plane.batch.in_flight, plane.batch.deepest) == (1, 2)
    clock.t = 1.0
    ran_in = planned.finish(outcome(2))
    assert ran_in is not None
    assert ran_in.size == pytest.approx(1.0)
    assert ran_in.depth == pytest.approx(2.0)
    assert planned.finish(outcome(2)) is None  # a second finish does nothing
    assert plane.batch.in_flight == 0


def test_finish_with_an_outcome_teaches_the_class_and_without_none_does_not() -> None:
    plane, _ = plane_with()
    first = plane.plan_chat(CHAT, 100, running=0)
    first.enter()
    first.finish(None)
    reports = {r.class_id: r for r in plane.controller.snapshot()}
    assert reports[first.class_id].samples == 0
    second = plane.plan_chat(CHAT, 100, running=0)
    second.enter()
    second.finish(outcome(second.k))
    reports = {r.class_id: r for r in plane.controller.snapshot()}
    assert reports[first.class_id].samples == 1


def test_without_speculation_runs_at_zero_and_is_refused_once_entered() -> None:
    plane, _ = plane_with(ControlOverrides(pin_k=3))
    planned = plane.plan_chat(CHAT, 100, running=0)
    plain = planned.without_speculation("sampled")
    assert (plain.k, plain.reason, plain.class_id) == (0, "sampled", planned.class_id)
    plain.enter()
    with pytest.raises(RuntimeError):
        plain.without_speculation("again")


def test_a_sampled_request_on_a_lossy_engine_is_unserved_by_drafts() -> None:
    """The plane's one "why k = 0" rule covers sampling too: a sampled request runs at
    k = 0 where the engine's sampled speculation is not lossless; a greedy one drafts."""
    assert unserved_by_drafts(None, None, "t1", lossless=False) == SAMPLED_NOT_EXACT
    assert unserved_by_drafts(None, None, "", lossless=False) == ""
    assert unserved_by_drafts(None, None, "t1", lossless=True) == ""
    assert unserved_by_drafts({"1": 2.0}, None, "t1", lossless=False).startswith("unserved")
    plane, _ = plane_with(None)
    reason = unserved_by_drafts(None, None, "t1", lossless=False)
    planned = plane.plan_chat(CHAT, 100, running=0, sampling="t1", unserved=reason)
    assert (planned.k, planned.reason, planned.engine_k) == (0, SAMPLED_NOT_EXACT, 0)


@pytest.mark.parametrize(
    "overrides",
    [None, ControlOverrides(pin_k=3), ControlOverrides(mode="static"), ControlOverrides(k_min=2)],
)
def test_an_unserved_parameter_runs_at_zero_whatever_the_flags(
    overrides: ControlOverrides | None,
) -> None:
    """A request carrying `logit_bias` or `min_p` never drafts: no class decision, pin,
    static mode or lower bound raises it, in either endpoint; an adaptive class still
    hears its outcome (a k = 0 run)."""
    plane, _ = plane_with(overrides)
    reason = unserved_by_drafts({"42": -100.0}, None)
    chat = plane.plan_chat(CHAT, 100, running=0, unserved=reason)
    completion = plane.plan_completion("def f():", 10, running=0, unserved=reason)
    for planned in (chat, completion):
        assert (planned.k, planned.reason) == (0, reason)
        assert planned.headers()["x-specgw-k"] == "0"
    assert plane.plan_chat(CHAT, 100, running=0).class_id == chat.class_id
    chat.enter()
    assert plane.batch.deepest == 0
    chat.finish(outcome(0))
    if overrides is None:
        reports = {r.class_id: r for r in plane.controller.snapshot()}
        assert reports[chat.class_id].samples == 1


def test_a_step_is_filed_only_when_it_ran_exactly_the_batch_in_flight() -> None:
    plane, _ = plane_with(ControlOverrides(pin_k=2))
    a = plane.plan_chat(CHAT, 100, running=0)
    b = plane.plan_chat(TOOLS, 100, running=1)
    a.enter()
    b.enter()
    # Two requests at k = 2: 2 x (1 + 2) tokens scheduled.
    assert plane.observe_step(EngineStep(0.01, decode_requests=2, decode_tokens=6))
    assert not plane.observe_step(EngineStep(0.01, decode_requests=2, decode_tokens=4))
    assert not plane.observe_step(
        EngineStep(0.01, decode_requests=2, decode_tokens=6, prefill_requests=1)
    )
    a.finish(None)
    b.finish(None)
    assert not plane.observe_step(EngineStep(0.01, decode_requests=0, decode_tokens=0))


def test_a_cap_lowers_the_batch_as_the_request_enters() -> None:
    plane, _ = plane_with(ControlOverrides(pin_k=3))
    deep = plane.plan_chat(CHAT, 100, running=0)
    deep.enter()
    assert plane.batch.deepest == 3
    capped = plane.plan_chat(TOOLS, 100, running=1)
    capped.plan = capped.plan._replace(k=1, cap=1)
    capped.enter()
    assert plane.batch.deepest == 1
