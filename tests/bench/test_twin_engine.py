"""The virtual-time engine: step costs, acceptance chains, caps, arrivals, outcomes, CRN."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from bench.twin.costs import StepCosts
from bench.twin.engine import LiveRequest, Plan, VirtualClock, simulate
from bench.twin.modes.static import EngineWide, NoSpec, PerRequestDepths, Static
from bench.twin.records import RunResult
from bench.twin.requests import TwinRequest, build_requests, class_counts, poisson_times
from bench.twin.schema import Profile, load_workload
from engine.interface import RequestOutcome

FIXTURES = Path(__file__).parent / "twin_fixtures"

#: Step ms = 10 + 2 k + b (batch b, deepest k); no drafter: 9 + b. Prefill 0.1 ms per
#: prompt token, drafter 0.05 more; first-token extra 1 ms per k.
PROFILE = Profile.model_validate(
    {
        "name": "linear",
        "source": "test",
        "max_k": 4,
        "batch_stats": {
            "1": {"0": 11.0, "4": 19.0},
            "2": {"0": 12.0, "4": 20.0},
        },
        "no_spec_step_ms": {"1": 10.0, "2": 11.0},
        "prefill_ms_per_token": {"target": 0.1, "drafter": 0.05},
        "first_token_extra_ms": {"4": 4.0},
    }
)
COSTS = StepCosts.of(PROFILE, 8)


def _request(index: int, runs: list[int], prompt: int = 10) -> TwinRequest:
    return TwinRequest(index, "c", 0, 0, 0, prompt, len(runs), (1.0,) * 16, bytes(runs))


def _run(requests: list[TwinRequest], source: object, clients: int = 1, **kw: object) -> RunResult:
    return simulate(requests, source, COSTS, VirtualClock(), clients=clients, **kw)  # type: ignore[arg-type]


def test_one_request_time_and_tokens_by_hand() -> None:
    # 5 tokens at k = 2: prefill -> 1 token; then runs[1] = 2 accepted -> 3 tokens (pos 4);
    # then runs[4] = 2, but one token is left -> done. Two decode steps at b = 1, k = 2.
    result = _run([_request(0, [0, 2, 0, 0, 2])], Static(2))
    prefill_ms = 10 * (0.1 + 0.05) + 2.0  # drafter prefills; first drafts at k = 2
    assert result.makespan_s == pytest.approx((prefill_ms + 2 * 15.0) / 1000)
    (record,) = result.records
    assert (record.output_tokens, record.verify_steps, record.accepted_tokens) == (5, 2, 4)
    assert record.draft_tokens == 4
    assert result.steps == 3


def test_the_fixed_depth_replay_matches_the_step_by_step_engine() -> None:
    """`engine_fixed` (static and fixed per-request modes) gives the records `simulate`
    gives step by step."""
    workload = load_workload(FIXTURES / "workload_small.json")
    requests = build_requests(workload, 5)
    for k in (0, 1, 3):
        for clients in (1, 3):
            stepwise_static = Static(k)
            stepwise_static.fixed_depths = False
            pairs = [
                (Static(k), stepwise_static),
                (
                    PerRequestDepths(lambda r, k=k: k + r.index % 2, fixed_depths=True),
                    PerRequestDepths(lambda r, k=k: k + r.index % 2),
                ),
            ]
            for fixed_source, stepwise in pairs:
                fixed = _run(requests, fixed_source, clients=clients)
                full = _run(requests, stepwise, clients=clients)
                assert fixed.records == full.records
                assert fixed.makespan_s == pytest.approx(full.makespan_s)


def test_no_spec_engine_pays_no_drafter() -> None:
    result = _run([_request(0, [0, 3, 3])], NoSpec())
    assert result.makespan_s == pytest.approx((10 * 0.1 + 2 * 10.0) / 1000)
    assert result.records[0].verify_steps == 0


def test_step_runs_at_the_deepest_request_and_each_accepts_at_its_own_k() -> None:
    depths = {0: 0, 1: 4}
    source = PerRequestDepths(lambda r: depths[r.index])
    a = _request(0, [0, 4, 4], prompt=10)
    b = _request(1, [0, 4, 4, 4], prompt=20)
    result = _run([a, b], source, clients=2)
    # One prefill step (both; only b's drafter prefills; first drafts at k = 4 -> 4 ms),
    # then b (k = 4) finishes in one step, a (k = 0) needs two: the first with b at
    # batch 2 / k = 4, the second alone at k = 0.
    prefill = 10 * 0.1 + 20 * 0.15 + 4.0
    assert result.makespan_s == pytest.approx((prefill + 20.0 + 11.0) / 1000)
    by_index = {r.index: r for r in result.records}
    assert by_index[0].verify_steps == 0
    # Counted as vLLM counts them, before the output is cut at its length.
    assert by_index[1].accepted_tokens == 4


def test_a_newcomer_at_zero_prefills_the_drafter_only_in_a_step_that_drafts() -> None:
    """Model Runner V2 runs the drafter over every request of a step it runs in, so a
    k = 0 newcomer entering beside one at k = 4 pays its drafter prefill (10 tokens at
    0.05 ms); alone, in a step no request drafts in, the gateway's engine skips it."""
    gateway = COSTS.on_gateway()
    assert gateway.idle_skips_drafter
    assert not COSTS.idle_skips_drafter
    depths = {0: 0, 1: 4}
    a = _request(0, [0, 4, 4], prompt=10)
    b = _request(1, [0, 4, 4, 4], prompt=20)
    source = PerRequestDepths(lambda r: depths[r.index])
    together = simulate([a, b], source, gateway, VirtualClock(), clients=2)
    prefill = 10 * 0.1 + 10 * 0.05 + 20 * 0.15 + 4.0
    # then batch 2 at depth 4 (20 ms), then a alone at k = 0: the no-drafter step (10 ms)
    assert together.makespan_s == pytest.approx((prefill + 20.0 + 10.0) / 1000)
    alone = simulate([a], PerRequestDepths(lambda r: 0), gateway, VirtualClock())
    assert alone.makespan_s == pytest.approx((10 * 0.1 + 2 * 10.0) / 1000)


class _Capper(PerRequestDepths):
    """First request at k = 4; the second lowers the batch to 1 as it enters."""

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        return Plan(4) if request.index == 0 else Plan(1, cap=1)


def test_a_newcomer_cap_lowers_the_requests_in_flight() -> None:
    first = _request(0, [0, 4, 4, 4, 4, 4, 4, 4, 4, 4])
    second = _request(1, [0, 4, 4, 4, 4, 4, 4, 4, 4, 4])
    result = _run([first, second], _Capper(lambda r: 0), clients=2)
    by_index = {r.index: r for r in result.records}
    # Both lowered to k = 1 from the start (they enter in the same step): 2 tokens a step.
    assert by_index[0].accepted_tokens == by_index[0].verify_steps
    assert by_index[0].draft_tokens == by_index[0].verify_steps


def test_closed_loop_keeps_at_most_c_requests_in_flight() -> None:
    requests = [_request(i, [0, 1, 1, 1, 1, 1]) for i in range(12)]
    result = _run(requests, Static(1), clients=3)
    events = sorted(
        [(r.first_s, 1) for r in result.records] + [(r.last_s, -1) for r in result.records]
    )
    live = peak = 0
    for _, step in events:
        live += step
        peak = max(peak, live)
    assert peak <= 3
    assert len(result.records) == 12


def test_poisson_requests_wait_for_their_arrival_and_for_room() -> None:
    requests = [_request(i, [0] * 4) for i in range(6)]
    times = [0.0, 0.0, 0.0, 1.0, 1.0, 5.0]
    result = _run(requests, Static(0), times=times, max_running=2)
    by_index = {r.index: r for r in result.records}
    assert all(by_index[i].first_s >= times[i] for i in range(6))
    assert by_index[2].first_s > by_index[0].last_s - 1e-12  # waited for room
    assert result.makespan_s == pytest.approx(by_index[5].last_s)


class _Outcomes(PerRequestDepths):
    observes = True

    def __init__(self) -> None:
        super().__init__(lambda r: 3)
        self.outcomes: list[RequestOutcome] = []

    def finish(self, plan: Plan, outcome: RequestOutcome | None) -> None:
        assert outcome is not None
        self.outcomes.append(outcome)


def test_outcome_counts_as_vllm_per_request_metrics() -> None:
    source = _Outcomes()
    # runs at positions 1, 3, 4, 7: 2 -> pos 4; 0 -> pos 5 ... as below
    runs = [0, 2, 0, 0, 0, 3, 0, 0, 1, 0, 0, 0]
    _run([_request(0, runs)], source)
    (outcome,) = source.outcomes
    spec = outcome.speculation
    # pos 1: a=2 -> 4; pos 4: a=0 -> 5; pos 5: a=3 -> 9; pos 9: a=0 -> 10; pos 10: 0 -> 11;
    # pos 11: 0 -> 12 (done). Six verify steps at k = 3.
    assert spec.verify_steps == 6
    assert spec.accepted_tokens == 5
    assert spec.draft_tokens == 18
    assert spec.accepted_per_position == (2, 2, 1)
    assert spec.drafted_per_position == (6, 6, 6)
    assert outcome.decode_steps == 7
    assert outcome.e2e_s > outcome.ttft_s > 0


class _Alternating(EngineWide):
    """One depth per step for the whole batch: 1, 3, 1, 3, ...; keeps the outcomes."""

    observes = True

    def __init__(self) -> None:
        self.steps = 0
        self.outcomes: list[RequestOutcome] = []

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        return Plan(3)

    def step_depth(self, batch: int, running: Sequence[LiveRequest] = ()) -> int:
        self.steps += 1
        return 1 if self.steps % 2 else 3

    def finish(self, plan: Plan, outcome: RequestOutcome | None) -> None:
        assert outcome is not None
        self.outcomes.append(outcome)


def test_steps_of_different_depths_report_the_joint_trials() -> None:
    source = _Alternating()
    runs = [0, 2, 0, 0, 3, 0, 0, 0, 1, 0, 2, 0, 0, 0]
    _run([_request(0, runs)], source)
    (outcome,) = source.outcomes
    spec = outcome.speculation
    # pos 1 at depth 1: a = 1 -> 3; pos 3 at 3: 0 -> 4; pos 4 at 1: 1 -> 6; pos 6 at 3:
    # 0 -> 7; pos 7 at 1: 0 -> 8; pos 8 at 3: 1 -> 10; pos 10 at 1: 1 -> 12; pos 12 at
    # 3: 0 -> 13; pos 13 at 1: 0 -> 14. Nine steps: depth 1 (a = 1, 1, 0, 1, 0), depth 3
    # (a = 0, 0, 1, 0).
    assert spec.verify_steps == 9
    assert spec.accepted_per_position == (4, 0, 0)
    assert spec.drafted_per_position == (9, 4, 4)
    # Position 2 was tried only in the depth-3 step that accepted position 1.
    assert spec.tried_per_position == (9, 1, 0)


def test_common_random_numbers_depend_on_seed_and_index_only() -> None:
    workload = load_workload(FIXTURES / "workload_small.json")
    first, again = build_requests(workload, 7), build_requests(workload, 7)
    assert first == again
    other = build_requests(workload, 8)
    assert [r.runs for r in first] != [r.runs for r in other]


def test_acceptance_draws_follow_the_conditional_profile() -> None:
    workload = load_workload(FIXTURES / "workload_small.json")
    requests = [r for r in build_requests(workload, 3) if r.class_name == "code"]
    runs = [run for r in requests for run in r.runs]
    n = len(runs)
    p1 = sum(run >= 1 for run in runs) / n
    p2_given_1 = sum(run >= 2 for run in runs) / max(sum(run >= 1 for run in runs), 1)
    assert p1 == pytest.approx(0.9, abs=0.02)
    assert p2_given_1 == pytest.approx(0.85, abs=0.02)


def test_shift_scales_acceptance_from_its_request_on() -> None:
    workload = load_workload(FIXTURES / "workload_small.json")
    chat = [r for r in build_requests(workload, 3) if r.class_name == "chat"]
    before = {r.acceptance[0] for r in chat if r.index < 60}
    after = {r.acceptance[0] for r in chat if r.index >= 60}
    assert before == {0.85}
    assert len(after) == 1
    assert after.pop() == pytest.approx(0.85 * 0.7)


@pytest.mark.parametrize(
    ("mix", "n", "expected"),
    [
        ({"a": 0.5, "b": 0.5}, 5, [("a", 3), ("b", 2)]),
        ({"a": 0.6, "b": 0.2, "c": 0.2}, 10, [("a", 6), ("b", 2), ("c", 2)]),
        ({"a": 0.34, "b": 0.33, "c": 0.33}, 3, [("a", 1), ("b", 1), ("c", 1)]),
    ],
)
def test_class_counts_are_exact(
    mix: dict[str, float], n: int, expected: list[tuple[str, int]]
) -> None:
    assert class_counts(mix, n) == expected


def test_poisson_times_have_the_rate() -> None:
    times = poisson_times(20.0, 4001, seed=1)
    assert times[0] == 0.0
    assert times[-1] / 4000 == pytest.approx(1 / 20.0, rel=0.05)
    assert times == poisson_times(20.0, 4001, seed=1)


def test_a_uniform_profile_verifies_the_steps_deepest_k_for_every_drafting_request() -> None:
    """CUDA's FULL decode graphs: a request at k = 1 beside one at k = 3 verifies 3 drafts,
    one at k = 0 none (`engine/vllm/batch_depth.py`); per-request, it verifies its own 1."""
    runs = [0] + [3] * 11
    requests = [_request(0, runs), _request(1, runs), _request(2, runs)]
    depths = {0: 1, 1: 3, 2: 0}
    uniform = replace(COSTS, uniform=True)
    for costs, drafts in ((COSTS, 1), (uniform, 3)):
        for fixed in (False, True):
            source = PerRequestDepths(lambda r: depths[r.index], fixed_depths=fixed)
            result = simulate(requests, source, costs, VirtualClock(), clients=3)
            by_index = {r.index: r for r in result.records}
            # Every draft is accepted (runs of 3): tokens per step are drafts + 1.
            assert by_index[0].draft_tokens == drafts * by_index[0].verify_steps
            assert by_index[0].accepted_tokens == by_index[0].draft_tokens
            assert by_index[2].draft_tokens == 0


class _HeldAtZero(Static):
    """An engine-wide source that holds its voters at depth 0 (as the step rule may)."""

    drafts_once_at_zero = True

    def __init__(self) -> None:
        super().__init__(0)
        self.fixed_depths = False


def test_on_the_gateways_engine_a_step_no_request_drafts_in_costs_no_drafter() -> None:
    """`StepCosts.on_gateway`: the profile's k = 0 (11 ms at batch 1) runs the drafter's
    KV pass; the gateway skips it where no request drafts now or later, so such a step
    costs the no-drafter step (10 ms), and with it a run of k = 0 requests what an
    engine without a drafter takes. A step the step rule holds at 0 keeps the pass
    (11 ms). A profile whose k = 0 already skips is the gateway's as it is."""
    gateway = COSTS.on_gateway()
    assert [row[0] for row in gateway.spec] == list(COSTS.no_spec)
    assert [row[1:] for row in gateway.spec] == [row[1:] for row in COSTS.spec]
    assert gateway.held_zero == tuple(row[0] for row in COSTS.spec)
    skipping = replace(COSTS, zero_skips_drafter=True)
    assert skipping.on_gateway() is skipping

    one = _request(0, [0, 3, 3])
    plain = simulate([one], NoSpec(), COSTS, VirtualClock())
    zero = simulate([one], PerRequestDepths(lambda _: 0), gateway, VirtualClock())
    assert zero.makespan_s == pytest.approx(plain.makespan_s)  # 1 ms of prefill + 2 x 10 ms
    assert zero.makespan_s == pytest.approx((1.0 + 2 * 10.0) / 1000)
    vllm = simulate([one], PerRequestDepths(lambda _: 0), COSTS, VirtualClock())
    assert vllm.makespan_s == pytest.approx((1.0 + 2 * 11.0) / 1000)
    held = simulate([one], _HeldAtZero(), gateway, VirtualClock())
    assert held.makespan_s == pytest.approx((10 * 0.15 + 2 * 11.0) / 1000)


@pytest.mark.parametrize(("skips", "step_ms"), [(True, 13.0), (False, 11.0)])
def test_a_step_rule_step_at_depth_0_drafts_one_where_depth_0_skips_the_drafter(
    skips: bool, step_ms: float
) -> None:
    """The engine's scheduler drafts one (verified by none) in such a step where depth 0
    skips the drafter, so it costs the profile's depth-1 step (11 + 2 ms here); a plain
    static k = 0 does not."""
    costs = replace(COSTS, zero_skips_drafter=skips)
    one = _request(0, [0, 3, 3])
    held = simulate([one], _HeldAtZero(), costs, VirtualClock())
    static = simulate([one], Static(0), costs, VirtualClock())
    prefill = 10 * 0.15  # the drafter prefills (k = 0 steps, engine-wide: no first drafts)
    assert held.makespan_s == pytest.approx((prefill + 2 * step_ms) / 1000)
    assert static.makespan_s == pytest.approx((prefill + 2 * 11.0) / 1000)
    assert held.records[0].verify_steps == 0
