"""The facade: ops overrides, reports, sharing deltas between replicas, cold start."""

from __future__ import annotations

import dataclasses
import random

import pytest

from gateway.control.classify import RequestClass
from gateway.control.controller import COST_ID, Controller
from gateway.control.cost_model import STALE_STEPS, STEPS_PER_REFRESH, CostModel
from gateway.control.decision import ControlOverrides, LoadSnapshot
from gateway.control.features import RequestFeatures
from gateway.control.policies.base import Choice, PolicyInput
from gateway.control.settings import ControllerSettings
from gateway.control.stats import ClassStats
from tests.control.simulator import StepCost, simulate
from tests.control.test_convergence import Recorder

HIGH = (0.9,) * 6
LOW = (0.05,) * 6
IDLE = LoadSnapshot()


def trained(p: tuple[float, ...], n: int = 80, seed: int = 1, **settings: object) -> Controller:
    controller = Controller(ControllerSettings.model_validate(settings), rng=random.Random(seed))
    cls = controller.classify(RequestFeatures("chat"))
    rng = random.Random(seed + 1)
    for _ in range(n):
        decision = controller.decide(cls, IDLE)
        controller.observe(cls, decision, simulate(rng, p, decision.k), IDLE)
    return controller


def _calibrate(controller: Controller, load: LoadSnapshot, per_draft: float) -> None:
    """Three uniform batches at every depth at this load, each draft adding `per_draft`."""
    for k in range(6):
        for _ in range(3):
            controller.cost_model.observe(k, load.batch, 0.02 * (1 + per_draft * k), depth=k)


OVERRIDES = [
    ("kill switch", ControlOverrides(enabled=False), 0, "kill switch"),
    ("pin wins over bounds", ControlOverrides(pin_k=1, k_min=3), 1, "pinned"),
    ("pin 0", ControlOverrides(pin_k=0), 0, "pinned"),
    ("pin clamped to K", ControlOverrides(pin_k=40), 5, "pinned"),
    ("static mode", ControlOverrides(mode="static"), 3, "static"),
    ("shadow applies static", ControlOverrides(mode="shadow"), 3, "shadow"),
    ("k_max bound", ControlOverrides(k_max=2, exploration_share=0.0), 2, None),
]


@pytest.mark.parametrize(
    ("name", "overrides", "k", "reason"), OVERRIDES, ids=[c[0] for c in OVERRIDES]
)
def test_ops_overrides(name: str, overrides: ControlOverrides, k: int, reason: str | None) -> None:
    controller = trained(HIGH)  # adaptive k would be 5
    cls = controller.classify(RequestFeatures("chat"))
    decision = controller.decide(cls, IDLE, overrides)
    assert decision.k == k
    assert not decision.explored
    if reason is not None:
        assert decision.reason == reason


def test_shadow_records_what_adaptive_would_do() -> None:
    controller = trained(HIGH)
    cls = controller.classify(RequestFeatures("chat"))
    decision = controller.decide(cls, IDLE, ControlOverrides(mode="shadow"))
    assert (decision.k, decision.shadow_k) == (3, 5)


def test_exploration_share_is_bounded_and_can_be_switched_off() -> None:
    controller = trained(HIGH)
    cls = controller.classify(RequestFeatures("chat"))
    off = ControlOverrides(exploration_share=0.0)
    assert not any(controller.decide(cls, IDLE, off).explored for _ in range(500))
    # At the trained load every depth has step-cost evidence: the configured share, k +- 1.
    assert controller.exploration.thin_depths(IDLE.batch, 3) == []
    k = controller.decide(cls, IDLE, off).k
    probes = [controller.decide(cls, IDLE) for _ in range(4000)]
    assert 0.03 < sum(d.explored for d in probes) / 4000 < 0.07  # configured 0.05
    assert {d.k for d in probes if d.explored} == {k - 1, k + 1} & set(range(6))
    # A load never seen: a calibration share (0.2) measures every other depth, k = 0
    # included, until each has its samples.
    busy = LoadSnapshot(running=40)
    calibrating = [controller.decide(cls, busy) for _ in range(4000)]
    assert 0.17 < sum(d.explored for d in calibrating) / 4000 < 0.23
    k_busy = controller.decide(cls, busy, off).k
    assert {d.k for d in calibrating if d.explored} == set(range(6)) - {k_busy}
    assert not any(controller.decide(cls, busy, off).explored for _ in range(200))


def test_probe_shares_are_per_batch_once_a_load_is_calibrated() -> None:
    """A probe deeper than its batch makes every request in it draft: at batch 16 the
    k +- 1 share is a 16th of its batch-1 value. A class at k = 0 whose measured
    acceptance cannot pay for k = 1 even at its upper bound (`exploration.may_pay_at_one`)
    does not probe under load at all (its probe would also prefill cold); at batch 1 it
    watches for a drift up at `exploration_share` x `watch_probe_scale` (0.5)."""
    low = Controller(ControllerSettings(), rng=random.Random(1))
    cls = low.classify(RequestFeatures("chat"))
    rng = random.Random(2)
    dear = StepCost(draft_cost=1.0)  # a drafted token costs a whole step (a busy CPU)
    for _ in range(400):  # long enough for its k = 1 probes to rule k = 1 out
        decision = low.decide(cls, IDLE)
        low.observe(cls, decision, simulate(rng, LOW, decision.k, cost=dear), IDLE)
    assert low.decide(cls, IDLE, ControlOverrides(exploration_share=0.0)).k == 0
    n = 8000
    idle_probes = sum(low.decide(cls, IDLE).explored for _ in range(n))
    assert 0.6 * n * 0.025 < idle_probes < 1.4 * n * 0.025
    for p, share, k_then in ((HIGH, 0.05, 5), (LOW, 0.0, 0)):
        controller = trained(p)
        cls = controller.classify(RequestFeatures("chat"))
        busy = LoadSnapshot(running=15)
        _calibrate(controller, busy, 0.1)
        assert controller.exploration.thin_depths(busy.batch, 3) == []
        off = ControlOverrides(exploration_share=0.0)
        assert controller.decide(cls, busy, off).k == k_then
        n = 16_000
        probes = sum(controller.decide(cls, busy).explored for _ in range(n))
        assert 0.6 * n * share / 16 <= probes <= 1.4 * n * share / 16


def test_a_class_held_at_zero_watches_more_often_where_a_probe_costs_less() -> None:
    """At k = 0 where k = 1 cannot pay even at its upper bound, a class watches for a
    drift up at `watch_probe_budget` over what a probe at k = 1 costs its request: a
    class that loses a few percent at k = 1 probes several times as often as one that
    loses most of its speed there, which stays at half its share."""
    rates = {}
    for name, p in (("near", (0.9,) * 6), ("far", LOW)):
        controller = Controller(ControllerSettings(), rng=random.Random(1))
        cls = controller.classify(RequestFeatures("chat"))
        rng = random.Random(2)
        dear = StepCost(draft_cost=0.85)  # near: 1.9 tokens a step at k = 1 for 1.85x its time
        for _ in range(400):
            decision = controller.decide(cls, IDLE)
            controller.observe(cls, decision, simulate(rng, p, decision.k, cost=dear), IDLE)
        quiet = ControlOverrides(exploration_share=0.0)
        assert controller.decide(cls, IDLE, quiet).k == 0
        held = controller._states[cls.class_id].buckets[1]
        assert not held.hopeful
        n = 8000
        rates[name] = sum(controller.decide(cls, IDLE).explored for _ in range(n)) / n
        want = controller.exploration.watch_share(0.05, held.watch_loss)
        assert 0.7 * want < rates[name] < 1.3 * want
    assert 0.6 * 0.025 < rates["far"] < 1.4 * 0.025
    assert rates["near"] > 2 * rates["far"]


def test_a_class_at_zero_follows_up_a_probe_that_finds_its_acceptance_back() -> None:
    """A class held at k = 0 (acceptance 0.05, a draft half a step) watches at a few
    percent. When its acceptance comes back (0.9, where k = 1 pays), the first watch
    probe that sees it alarms the drift detector upward, and while the detector
    re-learns its noise the class probes at `zero_probe_share` (the variable sampling
    interval, `DriftMonitor.rising`): the next probe comes within a few requests, not
    a watch interval later, and the class leaves k = 0 within tens of requests."""
    follow_ups, recoveries = [], []
    for seed in range(1, 8):
        controller = Controller(ControllerSettings(), rng=random.Random(seed))
        cls = controller.classify(RequestFeatures("chat"))
        rng = random.Random(seed + 100)
        cost = StepCost(draft_cost=0.5)
        for _ in range(400):
            decision = controller.decide(cls, IDLE)
            controller.observe(cls, decision, simulate(rng, LOW, decision.k, cost=cost), IDLE)
        state = controller._states[cls.class_id]
        assert state.buckets[1].k == 0
        assert not state.buckets[1].hopeful
        assert not state.drift.rising
        probes: list[int] = []
        for i in range(400):
            decision = controller.decide(cls, IDLE)
            controller.observe(cls, decision, simulate(rng, HIGH, decision.k, cost=cost), IDLE)
            if decision.explored:
                probes.append(i)
                if len(probes) == 1:
                    assert state.drift.rising
            elif decision.k > 0:
                recoveries.append(i - probes[0])
                break
        follow_ups.append(probes[1] - probes[0])
    assert len(recoveries) == 7
    # At the watch share (a probe loses about 30 % of its request here: 2.5 %) the
    # next probe would come some 40 requests later.
    assert sorted(follow_ups)[3] <= 10
    assert sorted(recoveries)[3] <= 25


def test_a_stale_k0_at_batch_1_is_probed_until_re_measured() -> None:
    """Once the traffic has run STALE_STEPS engine steps at batch 1 without k = 0 and
    the depth it runs at has moved (the host changed speed), the price every relative
    cost divides by describes the host as it was: k = 0 is probed at
    `cost_probe_share` (0.2) until it has steps of the host as it is, then exploration
    is back at its share. Where the visited depth kept its price, k = 0's holds too:
    no probe at k = 0 beyond the share's. (Calibrated long enough that the trained
    requests' means, filed before the first engine step, no longer move a depth's.)"""
    controller = trained(HIGH)
    cls = controller.classify(RequestFeatures("chat"))
    cost = controller.cost_model
    for _ in range(2000):  # the start-up calibration's steps, and traffic at every depth
        for d in range(6):
            cost.observe_step(1, d, 0.01 * (1 + 0.1 * d))
    k = controller.decide(cls, IDLE, ControlOverrides(exploration_share=0.0)).k
    assert k > 1
    n = 4000
    assert sum(controller.decide(cls, IDLE).explored for _ in range(n)) < 1.4 * n * 0.05
    for _ in range(STALE_STEPS + STEPS_PER_REFRESH):
        cost.observe_step(1, k, 0.01 * (1 + 0.1 * k))
    assert controller.exploration.thin_depths(1, 3.0) == []  # same host: k = 0 holds
    for _ in range(STALE_STEPS):  # the host runs 1.5x faster now
        cost.observe_step(1, k, 0.01 * (1 + 0.1 * k) / 1.5)
    probes = [d.k for d in (controller.decide(cls, IDLE) for _ in range(n)) if d.explored]
    assert 0.6 * n * 0.2 < len(probes) < 1.4 * n * 0.2
    assert set(probes) == {0}
    for _ in range(STEPS_PER_REFRESH):
        cost.observe_step(1, 0, 0.01)
    assert controller.exploration.thin_depths(1, 3.0) == []
    assert sum(controller.decide(cls, IDLE).explored for _ in range(n)) < 1.4 * n * 0.05


def test_snapshot_explains_each_class() -> None:
    controller = trained(HIGH, n=100)
    (report,) = controller.snapshot()
    assert report.label == "chat/len:64"
    assert report.samples == 100
    assert report.k == 5
    assert report.reason.startswith("goodput +")
    assert 4.0 < report.acceptance_length < 5.5
    low, high = report.acceptance_length_ci
    assert low < report.acceptance_length < high
    assert all(0.8 < p < 1.0 for p in report.depth_profile)
    assert report.drift_state == "stable"
    assert len(report.depth_trials) == len(report.depth_profile)
    assert all(t > 0 for t in report.depth_trials)  # k = 5 tried every position
    row = report.to_dict()
    assert row["k_by_batch"] == {"1": 5}
    assert isinstance(row["depth_profile"], list)
    assert row["depth_trials"] == list(report.depth_trials)


def test_snapshot_tells_a_borrowed_profile_from_a_measured_one() -> None:
    """A class seeded `like` another whose requests run no drafts (here k = 0 by the
    flags) reports the other's p_d with no verify step at any position; one request at
    k = 2 measures positions 1 and 2 only."""
    controller = trained(HIGH, n=100)
    similar = controller.classify(RequestFeatures("chat", length=128))
    held = ControlOverrides(k_max=0)
    rng = random.Random(9)
    first = controller.decide(similar, IDLE, ControlOverrides(exploration_share=0.0))
    assert first.reason == "cold start: like chat/len:64"
    for _ in range(5):
        decision = controller.decide(similar, IDLE, held)
        assert decision.k == 0
        controller.observe(similar, decision, simulate(rng, HIGH, 0), IDLE)
    rows = {r.label: r for r in controller.snapshot()}
    borrowed = rows["chat/len:128"]
    assert borrowed.samples == 5
    assert borrowed.depth_profile == rows["chat/len:64"].depth_profile
    assert set(borrowed.depth_trials) == {0}
    decision = controller.decide(similar, IDLE, ControlOverrides(pin_k=2))
    controller.observe(similar, decision, simulate(rng, HIGH, 2), IDLE)
    trials = {r.label: r for r in controller.snapshot()}["chat/len:128"].depth_trials
    assert min(trials[:2]) > 0
    assert set(trials[2:]) == {0}


def test_drift_event_carries_before_and_after() -> None:
    events = Recorder()
    controller = Controller(ControllerSettings(), events=events, rng=random.Random(3))
    cls = controller.classify(RequestFeatures("chat"))
    rng = random.Random(4)
    for p in (HIGH,) * 80 + (LOW,) * 20:
        decision = controller.decide(cls, IDLE)
        controller.observe(cls, decision, simulate(rng, p, decision.k), IDLE)
    assert len(events.drifts) == 1
    event = events.drifts[0]
    assert event.direction == -1
    assert event.length_before > 4.0
    assert event.profile_before[0] > 0.8
    assert event.profile_after[0] < event.profile_before[0]
    assert controller.snapshot()[0].drift_state == "drift down"
    assert events.changes[-1].new_k < 5


def test_replicas_share_evidence_through_deltas() -> None:
    """Replica B, which never served the class, decides from A's exported deltas."""
    a = trained(HIGH, n=100)
    deltas = a.export_deltas()
    cls_id = a.snapshot()[0].class_id
    assert deltas.outcomes == 100
    assert deltas.counters[cls_id]["requests"] == 100
    assert deltas.meta[cls_id] == {"label": "chat/len:64", "k": "5"}
    assert COST_ID in deltas.counters
    assert a.export_deltas().counters == {}  # exported once

    b = Controller(ControllerSettings(), rng=random.Random(9))
    b.merge(deltas.counters, deltas.meta)  # the cluster totals as Redis would hold them
    cls = b.classify(RequestFeatures("chat"))
    decision = b.decide(cls, IDLE, ControlOverrides(exploration_share=0.0))
    assert decision.k == 5
    assert b.snapshot()[0].samples == 100
    # Merging the same totals again adds nothing; new totals add only the increment.
    b.merge(deltas.counters)
    assert b.snapshot()[0].samples == 100


def test_stats_counters_round_trip_and_add_up() -> None:
    rng = random.Random(5)
    one, two, both = ClassStats(5), ClassStats(5), ClassStats(5)
    for stats in (one, two):
        outcome = simulate(rng, HIGH, 4)
        stats.add_outcome(outcome)
        both.add_outcome(outcome)
    summed = ClassStats.from_counters(one.to_counters(), 5)
    summed.add(ClassStats.from_counters(two.to_counters(), 5))
    assert summed.to_counters() == pytest.approx(both.to_counters())
    assert both.minus(one).to_counters() == pytest.approx(two.to_counters())


def test_cost_model_learns_step_times_not_constants() -> None:
    truth = StepCost(base_s=0.05, draft_cost=0.2, saturation=8.0)
    model = CostModel(5, 0.02, 0.08, 16.0, 2.0, 0.0)
    rng = random.Random(6)
    for _ in range(300):
        k, batch = rng.randint(0, 5), rng.choice((1, 16))
        model.observe_outcome(simulate(rng, HIGH, k, batch, truth), batch)
    for batch in (1, 16):
        want = [truth.seconds(k, batch) / truth.seconds(0, batch) for k in range(6)]
        assert model.relative_costs(batch) == pytest.approx(want, rel=0.05)


def test_new_class_starts_from_a_similar_known_class() -> None:
    controller = trained(HIGH, n=100)
    similar = controller.classify(RequestFeatures("chat", length=128))
    decision = controller.decide(similar, IDLE, ControlOverrides(exploration_share=0.0))
    assert decision.k == 5
    assert decision.reason == "cold start: like chat/len:64"
    unlike = controller.classify(
        RequestFeatures("llama2", system_id="ab", tools=True, response_format="json_object")
    )
    assert controller.decide(unlike, IDLE, ControlOverrides(exploration_share=0.0)).k == 3
    # cold_start="prior": no similar class starts at the policy's best k under the prior.
    controller = trained(HIGH, n=100, cold_start="prior")
    unlike = controller.classify(
        RequestFeatures("llama2", system_id="ab", tools=True, response_format="json_object")
    )
    fresh = controller.decide(unlike, IDLE, ControlOverrides(exploration_share=0.0))
    assert fresh.reason == "cold start: prior"
    assert fresh.k == max(
        range(6), key=lambda k: fresh.gains[k] / controller.cost_model.relative_costs(1)[k]
    )


def test_settings_come_from_the_environment_only_when_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPECGW_CONTROL_MAX_CLASSES", "7")
    monkeypatch.setenv("SPECGW_CONTROL_DEFAULT_K", "2")
    settings = ControllerSettings()
    assert (settings.max_classes, settings.default_k) == (7, 2)
    monkeypatch.setenv("SPECGW_CONTROL_DEFAULT_K", "9")
    with pytest.raises(ValueError, match="default_k"):
        ControllerSettings()


def count_policy_runs(controller: Controller) -> list[int]:
    """Wrap the controller's policy; the returned cell counts its evaluations."""
    policy = controller._policy
    runs = [0]
    choose = policy.choose

    def counting(inp: PolicyInput) -> Choice:
        runs[0] += 1
        return choose(inp)

    policy.choose = counting  # type: ignore[method-assign]
    return runs


def test_observe_pre_evaluates_the_next_decision_off_the_request_path() -> None:
    """After `observe`, a decide at the same load and bounds runs no policy evaluation."""
    controller = trained((0.8, 0.7, 0.6, 0.5, 0.4, 0.3), n=30)
    calls = count_policy_runs(controller)
    cls = controller.classify(RequestFeatures("chat"))
    decision = controller.decide(cls, IDLE)
    controller.observe(cls, decision, simulate(random.Random(5), (0.8,) * 6, decision.k), IDLE)
    calls_after_observe = calls[0]
    controller.decide(cls, IDLE)
    assert calls_after_observe >= 1
    assert calls[0] == calls_after_observe


def test_a_held_decision_is_the_same_object_until_k_or_reason_changes() -> None:
    """The request path hands out the cached decision instead of building one per request."""
    controller = trained((0.8, 0.7, 0.6, 0.5, 0.4, 0.3), n=30)
    cls = controller.classify(RequestFeatures("chat"))
    quiet = ControlOverrides(exploration_share=0.0)
    first = controller.decide(cls, IDLE, quiet)
    assert controller.decide(cls, IDLE, quiet) is first
    pinned = controller.decide(cls, IDLE, ControlOverrides(pin_k=first.k + 1))
    assert pinned.k == first.k + 1
    assert pinned.reason == "pinned"
    narrowed = controller.decide(cls, IDLE, ControlOverrides(exploration_share=0.0, k_max=0))
    assert narrowed.k == 0
    assert narrowed is not first


def test_the_request_path_runs_the_policy_only_for_a_new_bucket_or_new_bounds() -> None:
    """A known bucket with newer evidence is served its cached k and refreshed after the
    next response; every bucket asked since the last response is refreshed, not only the
    last one."""
    controller = trained(HIGH, n=40, exploration_share=0.0, cost_probe_share=0.0)
    runs = count_policy_runs(controller)
    cls = controller.classify(RequestFeatures("chat"))
    busy = LoadSnapshot(running=7)  # batch 8: a bucket the class was never decided at
    quiet = ControlOverrides(exploration_share=0.0)
    controller.decide(cls, busy, quiet)
    assert runs[0] == 1  # new bucket: evaluated at once
    rng = random.Random(7)
    for _ in range(60):  # acceptance collapses; decided and observed at the idle bucket only
        decision = controller.decide(cls, IDLE, quiet)
        controller.observe(cls, decision, simulate(rng, LOW, decision.k), IDLE)
    idle_k = controller.decide(cls, IDLE, quiet).k
    runs[0] = 0
    stale = controller.decide(cls, busy, quiet)
    assert runs[0] == 0  # known bucket, same bounds: the cached k, however old its evidence
    assert stale.k > idle_k  # the busy bucket still holds what HIGH acceptance chose
    controller.decide(cls, IDLE, quiet)  # a second bucket asked before the next response
    decision = controller.decide(cls, IDLE, quiet)
    controller.observe(cls, decision, simulate(rng, LOW, decision.k), IDLE)
    assert runs[0] == 2  # both buckets asked since the last response, once each
    assert controller.decide(cls, busy, quiet).k < stale.k
    assert runs[0] == 2
    narrowed = controller.decide(cls, busy, ControlOverrides(exploration_share=0.0, k_max=1))
    assert runs[0] == 3  # new bounds: evaluated at once, a k outside them must go now
    assert narrowed.k <= 1


def test_a_class_is_held_to_the_depth_its_batch_gains_from() -> None:
    """A step costs what its deepest request asks, so a class's k is paid by every
    request in flight. Beside three requests that stay at k = 0 whatever the depth
    (sampled ones: `gains` of one token), a class that chose k = 5 runs at k = 0;
    beside three of its own kind at k = 5 it keeps its k: at 4 the batch would yield
    0.25 % more a step cost, less than what it gives up while they keep the batch at 5."""
    controller = trained(HIGH)
    cls = controller.classify(RequestFeatures("chat"))
    load = LoadSnapshot(running=3)
    _calibrate(controller, load, 0.4)
    off = ControlOverrides(exploration_share=0.0)
    alone = controller.decide(cls, load, off)
    assert alone.k == 5
    assert len(alone.gains) == 6
    assert alone.gains[0] == 1.0
    assert alone.gains[5] > 4.0
    plain = load._replace(mates=[3.0] * 17)
    held = controller.decide(cls, plain, off)
    assert held.k == 0
    assert held.reason.startswith("batch:")
    assert controller.decide(cls, plain, off) is held  # cached, as unexplored decisions are
    assert held.gains == alone.gains  # it still counts as a k = 5 class for the others
    kin = load._replace(mates=[3 * g for g in alone.gains] + [3 * alone.gains[-1]] * 11, deepest=5)
    assert controller.decide(cls, kin, off) is alone
    # The flags' k_min still binds, and an idle engine has no batch-mates to weigh.
    assert controller.decide(cls, plain, ControlOverrides(k_min=2, exploration_share=0.0)).k == 2
    assert controller.decide(cls, plain._replace(running=0), off).k == 5


def _held_at_zero(min_samples: int) -> tuple[Controller, RequestClass]:
    """A controller starting classes at k = 0 on batch-1 costs calibrated like a CPU's
    (20 ms steps, 0.37 of one a draft; first token 30 ms at k = 0, 70 ms deeper; 1.5 ms a
    cold prompt token), and its long-prompt chat class."""
    controller = Controller(
        ControllerSettings(default_k=0, cold_start="default", min_samples=min_samples),
        rng=random.Random(5),
    )
    cost = controller.cost_model
    _calibrate(controller, IDLE, 0.37)
    for k, seconds in enumerate((0.03, 0.07, 0.07, 0.07, 0.07, 0.07)):
        cost.calibrate_first_token(k, 1, seconds)
    cost.calibrate_prefill(0.0015)
    return controller, controller.classify(RequestFeatures("chat", length=2048))


def _probe_share_after(cached_share: float) -> float:
    """Share of k = 1 probes at batch 1 of a cold-start class held at k = 0, after 20
    k = 0 runs of 1,300-token prompts with `cached_share` of them found cached, on an
    engine calibrated at 1.5 ms a cold prompt token (20 ms steps)."""
    controller, cls = _held_at_zero(1000)
    rng = random.Random(6)
    for _ in range(20):
        decision = controller.decide(cls, IDLE, ControlOverrides(exploration_share=0.0))
        outcome = simulate(rng, HIGH, decision.k, prompt_tokens=1300)
        outcome = dataclasses.replace(outcome, cached_prompt_tokens=int(1300 * cached_share))
        controller.observe(cls, decision, outcome, IDLE)
    n = 4000
    return sum(controller.decide(cls, IDLE).explored for _ in range(n)) / n


def test_a_probe_is_priced_by_the_prompt_it_prefills_again() -> None:
    """k = 0 requests cache apart (`engine.vllm.scheduler`): a probe of k = 1 prefills again
    what the class's k = 0 runs find cached. Long cached prompts: the probe cannot pay,
    the class only watches for a drift, at `exploration_share` x `watch_probe_scale`
    (0.025); long prompts never cached (each one new): it may, at `zero_probe_share` (0.2)."""
    assert 0.015 < _probe_share_after(0.98) < 0.035
    assert 0.16 < _probe_share_after(0.0) < 0.24


def _k_after_cold_start(zero_cached: float, spec_runs: int = 0) -> int:
    """The k of a class held at k = 0 through cold start (8 requests, no probes) after
    12 k = 0 runs of 1,300-token prompts with `zero_cached` of them found cached, then
    `spec_runs` pinned k = 1 runs that found theirs cached too, on the calibration of
    `_probe_share_after`. Acceptance evidence: the prior's 0.7 only."""
    controller, cls = _held_at_zero(8)
    rng = random.Random(6)
    quiet = ControlOverrides(exploration_share=0.0)
    prior = (0.7, 0.665, 0.632, 0.6, 0.57)
    runs = [quiet] * 12 + [ControlOverrides(pin_k=1)] * spec_runs
    for overrides in runs:
        decision = controller.decide(cls, IDLE, overrides)
        outcome = simulate(rng, prior, decision.k, prompt_tokens=1300)
        cached = int(1300 * (zero_cached if decision.k == 0 else 0.98))
        controller.observe(
            cls, decision, dataclasses.replace(outcome, cached_prompt_tokens=cached), IDLE
        )
    return controller.decide(cls, IDLE, quiet).k


def test_leaving_k0_is_priced_by_the_prompts_prefilled_again() -> None:
    """k = 0 requests cache apart (`engine.vllm.scheduler`): a class whose k = 0 runs find
    their long prompts cached stays at k = 0 when it leaves cold start on the prior
    alone (at k > 0 each request would prefill its prompt again); with prompts never
    cached, or once its k > 0 runs find them cached there too, it moves."""
    assert _k_after_cold_start(0.98) == 0
    assert _k_after_cold_start(0.0) > 0
    assert _k_after_cold_start(0.98, spec_runs=3) > 0


def test_a_batch_floor_holds_a_newcomer_at_a_depth_its_mates_can_bear() -> None:
    """At batch 4 with steps 1.4x dearer per drafted token, a class that chose k = 5
    beside a guarded tool call at k = 0 (one token a step at any depth, floor 0.98) is
    held at k = 0: any deeper step would cost the tool call its floor (also where the
    batch already runs deep: the newcomer would keep it so). A mate that gains from
    depth up to 2 (1.95 tokens at D = 2 for steps 1.8x dearer: 1.08 of its k = 0
    speed; 2.0 for 2.2x at D = 3: 0.91) bears D = 2. Without the floor the class keeps
    its k."""
    controller = trained(HIGH)
    cls = controller.classify(RequestFeatures("chat"))
    off = ControlOverrides(exploration_share=0.0)
    _calibrate(controller, LoadSnapshot(running=3), 0.4)
    alone = controller.decide(cls, LoadSnapshot(running=3), off)
    assert alone.k == 5
    # Three deep mates of its kind: the batch's tokens alone would keep k = 5.
    mates = [3 * g for g in alone.gains] + [3 * alone.gains[-1]] * 11
    Guarded = dict[tuple[tuple[float, ...], float], int]
    tool: Guarded = {((1.0,), 0.98): 1}
    held = controller.decide(cls, LoadSnapshot(running=3, mates=mates, guarded=tool), off)
    assert held.k == 0
    assert "batch floor" in held.reason
    gaining: Guarded = {((1.0, 1.9, 1.95, 2.0, 2.0, 2.0), 0.98): 1}
    assert controller.decide(cls, LoadSnapshot(3, mates=mates, guarded=gaining), off).k == 2
    unguarded = LoadSnapshot(running=3, mates=mates, deepest=5)
    assert controller.decide(cls, unguarded, off).k == 5
    # Probes do not cross the floor either.
    probing = ControlOverrides(exploration_share=1.0)
    for _ in range(20):
        k = controller.decide(cls, LoadSnapshot(3, mates=mates, guarded=tool), probing).k
        assert k == 0


def test_a_shallow_class_rides_at_the_depth_a_request_in_flight_chose() -> None:
    """A class at k = 0 (little acceptance) entering a batch that a request in flight
    chose to run at k = 4 pays for depth 4 anyway (the drafter drafts it for every
    request in the step), so it runs at 4 and keeps what its drafts give; it anchors at
    its class's 0. Not where no request in flight chose the depth (riders only), not
    past its flags' k_max, not with `batch-ride` off or a `batch-floor`, not alone, not
    where the batch's tokens held it below its class's k."""
    controller = trained(LOW)
    cls = controller.classify(RequestFeatures("chat"))
    _calibrate(controller, LoadSnapshot(running=3), 0.4)
    off = ControlOverrides(exploration_share=0.0)
    assert controller.decide(cls, LoadSnapshot(running=3), off).k == 0
    deep = LoadSnapshot(running=3, deepest=4, anchored=4)
    ride = controller.decide(cls, deep, off)
    assert (ride.k, ride.anchor) == (4, 0)
    assert "rides at k=4" in ride.reason
    assert ride.gains[4] > ride.gains[0] == 1.0  # its tokens per step at depth 4
    assert controller.decide(cls, deep, off) is ride  # cached like the held decisions
    assert controller.decide(cls, deep._replace(anchored=0), off).k == 0
    assert controller.decide(cls, deep, dataclasses.replace(off, k_max=2)).k == 2
    assert controller.decide(cls, deep, dataclasses.replace(off, batch_ride=False)).k == 0
    floored = controller.decide(cls, deep, dataclasses.replace(off, batch_floor=0.98))
    assert (floored.k, floored.anchor) == (0, None)
    assert controller.decide(cls, deep._replace(running=0), off).anchor is None
    # A class that chose deeper than the anchor is not raised or lowered by it; one the
    # batch's tokens hold below its k (three mates that gain nothing from depth) is not
    # raised either: the batch is to come down, and a rider would keep it deep.
    high = trained(HIGH)
    chat = high.classify(RequestFeatures("chat"))
    _calibrate(high, LoadSnapshot(running=3), 0.4)
    assert high.decide(chat, LoadSnapshot(running=3, deepest=2, anchored=2), off).k == 5
    plain = LoadSnapshot(running=3, mates=[3.0] * 17, deepest=4, anchored=4)
    held = high.decide(chat, plain, off)
    assert (held.k, held.anchor) == (0, None)
    assert held.reason.startswith("batch: k=0")


def test_a_guarded_newcomer_lowers_a_deeper_batch_to_what_its_floor_allows() -> None:
    """Requests already in flight keep their depth, so a short guarded request entering a
    batch at k = 5 paid for it all its life. With a floor it asks the engine to lower
    them (`batch_cap`): to 0 where it gains nothing from depth (each draft adds 0.4 of
    a step), to the deepest depth its own tokens per step still pay for; none without
    a floor, or where the batch is no deeper than it."""
    controller = trained(LOW)
    cls = controller.classify(RequestFeatures("chat"))
    _calibrate(controller, LoadSnapshot(running=3), 0.4)
    floor = ControlOverrides(exploration_share=0.0, batch_floor=0.98)
    deep = LoadSnapshot(running=3, deepest=5)
    decision = controller.decide(cls, deep, floor)
    assert decision.k == 0
    assert decision.batch_cap == 0
    assert "lowers the batch from k=5 to k=0" in decision.reason
    assert controller.decide(cls, deep, ControlOverrides(exploration_share=0.0)).batch_cap is None
    assert controller.decide(cls, LoadSnapshot(running=3), floor).batch_cap is None
    # A class held at k = 2 yielding about 2.7 tokens a step bears steps up to 2.7 / 0.98
    # of a k = 0 step: the batch comes down from 5 to about 4, not to 2.
    high = trained(HIGH)
    chat = high.classify(RequestFeatures("chat"))
    _calibrate(high, LoadSnapshot(running=3), 0.4)
    bounded = ControlOverrides(exploration_share=0.0, batch_floor=0.98, k_max=2)
    held = high.decide(chat, deep, bounded)
    own = held.gains[held.k]
    costs = high.cost_model.relative_costs_in(4)
    assert held.k == 2
    assert held.batch_cap is not None
    assert 2 < held.batch_cap < 5
    assert own >= 0.98 * costs[held.batch_cap]
    if held.batch_cap < 5:
        assert own < 0.98 * costs[held.batch_cap + 1]


def test_a_newcomer_lowers_a_deep_batch_where_the_batch_gains_from_it() -> None:
    """One request at k = 5 (its class chose it alone, where drafts were cheap) and two
    mates that gain little from depth: at batch 4, each draft adding 0.4 of a step, the
    batch yields more tokens per unit of step cost at a lower depth, so a newcomer of a
    class at k = 0 caps the batch there (`batch_cap`), riding at the cap where that is
    above 0. Not where drafts are nearly free (the deep request pays), not with
    `batch-lower` off (it rides at the batch's depth instead) or a `batch-floor`, not
    where no one tracks the batch's gains, not while an operator's k is in flight."""
    low = trained(LOW)
    cls = low.classify(RequestFeatures("chat"))
    _calibrate(low, LoadSnapshot(running=3), 0.4)
    off = ControlOverrides(exploration_share=0.0)
    costs = low.cost_model.relative_costs_in(4)
    # In flight: the deep request, 1 + 0.9 + 0.81 + ... tokens a step at depth D, and
    # two mates at one token a step whatever the depth.
    deep_one = [sum(0.9**i for i in range(d + 1)) for d in range(17)]
    mates = [deep_one[min(d, 5)] + 2.0 for d in range(17)]
    load = LoadSnapshot(running=3, mates=mates, deepest=5, anchored=5)
    # Untracked gains: no lowering; it rides at 5 with E[tokens | D] as its gains.
    untracked = low.decide(cls, load._replace(mates=None), off)
    assert (untracked.batch_cap, untracked.k) == (None, 5)
    expected = untracked.gains  # it rides at the cap: E[tokens | D] at each D
    lowered = low.decide(cls, load, off)
    values = [(mates[d] + expected[d]) / costs[d] for d in range(6)]
    best = max(range(6), key=values.__getitem__)
    assert best < 5
    assert lowered.batch_cap == best
    assert lowered.k == best  # rides at the cap, the depth the batch now drafts
    assert f"lowers the batch from k=5 to k={best}" in lowered.reason
    # Drafts nearly free: the batch's tokens are highest at its depth; it rides there.
    cheap = trained(LOW)
    _calibrate(cheap, LoadSnapshot(running=3), 0.01)
    kept = cheap.decide(cheap.classify(RequestFeatures("chat")), load, off)
    assert (kept.batch_cap, kept.k) == (None, 5)
    unlowered = low.decide(cls, load, dataclasses.replace(off, batch_lower=False))
    assert (unlowered.batch_cap, unlowered.k) == (None, 5)
    floored = low.decide(cls, load, dataclasses.replace(off, batch_floor=0.5))
    assert "tokens per step cost" not in floored.reason  # the floor's own cap, if any
    # An operator's k in flight (a pin) is not lowered: it rides at the batch's depth.
    pinned = low.decide(cls, load._replace(fixed=1), off)
    assert (pinned.batch_cap, pinned.k) == (None, 5)
    assert low.decide(cls, IDLE, ControlOverrides(pin_k=4)).fixed
    # Without riding the newcomer keeps its own k under the cap.
    still = low.decide(cls, load, dataclasses.replace(off, batch_ride=False))
    assert (still.batch_cap, still.k) == (best, 0)


def test_class_depth_is_the_classs_choice_whatever_the_batch_made_of_a_request() -> None:
    """`Controller.class_depth`: a class's k at a bucket, not a ride's or a probe's k;
    None for a class or a bucket it has no choice for."""
    low = trained(LOW)
    cls = low.classify(RequestFeatures("chat"))
    assert low.class_depth(cls.class_id, 4) is None  # never decided at batch 4
    _calibrate(low, LoadSnapshot(running=3), 0.01)
    deep_one = [sum(0.9**i for i in range(d + 1)) for d in range(17)]
    mates = [deep_one[min(d, 5)] for d in range(17)]
    load = LoadSnapshot(running=3, mates=mates, deepest=5, anchored=5)
    rides = low.decide(cls, load, ControlOverrides(exploration_share=0.0))
    assert rides.k == 5  # drafts nearly free: it rides at the batch's depth
    assert rides.anchor is not None
    assert rides.anchor < 5
    assert low.class_depth(cls.class_id, 4) == rides.anchor
    alone = low.decide(cls, IDLE, ControlOverrides(exploration_share=0.0))
    assert low.class_depth(cls.class_id, 1) == alone.k
    assert low.class_depth("no-such-class", 1) is None
