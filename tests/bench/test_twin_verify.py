"""Adaptive verification in the twin: the confidence draws, the Poisson load, and the modes
`vllm-av` / `gateway-av` running the engine's budget rule (`engine.verify_budget`)."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import engine.verify_budget as verify_budget
from bench.twin.cli import PROFILES, WORKLOADS
from bench.twin.confidence import auc_of, separation
from bench.twin.modes.verify import GATEWAY_AV, VLLM_AV
from bench.twin.requests import arrival_times, build_requests
from bench.twin.runner import Case, run_case, scaled
from bench.twin.schema import PoissonArrival, load_profile, load_workload

TWIN = Path(__file__).resolve().parents[2] / "bench" / "twin"


def _case(requests: int = 40, profile: str = "h100-llama8b-eagle3") -> Case:
    workload = scaled(load_workload(WORKLOADS / "production-mix.json"), requests)
    workload = workload.model_copy(update={"arrivals": workload.arrivals[1:2]})  # c4
    return Case(load_profile(PROFILES / f"{profile}.json"), workload)


def _auc(features: np.ndarray, accepted: np.ndarray) -> float:
    """Mann-Whitney: the share of (accepted, rejected) pairs the feature orders right."""
    neg = np.sort(features[~accepted])
    return float(np.searchsorted(neg, features[accepted]).mean() / len(neg))


def test_the_same_seed_draws_the_same_confidence_and_acceptance_pairs() -> None:
    workload = scaled(load_workload(WORKLOADS / "production-mix.json"), 30)
    a, b = build_requests(workload, 7, 1.0), build_requests(workload, 7, 1.0)
    plain = build_requests(workload, 7)
    for x, y, z in zip(a, b, plain, strict=True):
        assert x.confidence is not None
        assert y.confidence is not None
        assert np.array_equal(x.confidence, y.confidence)
        # The confidence stream leaves the acceptance draws as they were.
        assert x.runs == y.runs == z.runs
        assert z.confidence is None
    other = build_requests(workload, 8, 1.0)
    first, again = a[0].confidence, other[0].confidence
    assert first is not None
    assert again is not None
    assert not np.array_equal(first, again)


@pytest.mark.parametrize(("auc", "scale"), [(0.75, 1.0), (0.9, 1.0), (0.75, 0.0), (0.75, 2.0)])
def test_features_tell_accepted_from_rejected_with_the_calibrated_auc(
    auc: float, scale: float
) -> None:
    from bench.twin.confidence import draw_features

    rng = np.random.default_rng(3)
    accepted = rng.random((20_000, 4)) < 0.6
    features = draw_features(accepted, separation(auc, scale), seed=1, index=0)
    assert _auc(features, accepted) == pytest.approx(auc_of(separation(auc, scale)), abs=0.01)


def test_a_poisson_arrival_by_load_reads_the_capacity() -> None:
    arrival = PoissonArrival(kind="poisson", load=0.5)
    assert arrival.label == "poisson-load0.5"
    times = arrival_times(arrival, 2001, seed=1, capacity_per_s=10.0)
    assert times is not None
    assert 2000 / times[-1] == pytest.approx(5.0, rel=0.1)
    with pytest.raises(ValueError, match="exactly one"):
        PoissonArrival(kind="poisson", load=0.5, rate_per_s=3.0)


def test_the_modes_run_the_engines_budget_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the engine's budget forced to 0, neither mode verifies a draft: the twin asks
    `engine.verify_budget` and decides nothing itself."""
    calls = []

    def no_budget(*args: object, **kwargs: object) -> int:
        calls.append(args)
        return 0

    case = _case()
    before = run_case(case, [1], modes=[VLLM_AV, GATEWAY_AV]).cells["c4"][1]
    monkeypatch.setattr(verify_budget, "step_budget", no_budget)
    after = run_case(case, [1], modes=[VLLM_AV, GATEWAY_AV]).cells["c4"][1]
    assert calls
    for mode in (VLLM_AV, GATEWAY_AV):
        assert (
            before[mode]["acceptance_length_by_class"] != after[mode]["acceptance_length_by_class"]
        )
        assert set(after[mode]["acceptance_length_by_class"].values()) == {1.0}


def test_no_budget_argmax_lives_in_the_twin() -> None:
    """The twin imports the rule; no module under bench/twin sorts survivals or takes a
    budget's argmax of its own (`engine.verify_budget` holds the only copy)."""
    offenders = []
    for path in sorted(TWIN.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and any(
                word in node.name for word in ("budget", "survival")
            ):
                offenders.append(f"{path.name}:{node.name}")
    assert offenders == []
    source = (TWIN / "modes" / "verify.py").read_text()
    assert "from engine.verify_budget import admitted_drafts" in source


def test_gateway_av_skips_the_drafter_where_every_cap_is_zero() -> None:
    from bench.twin.costs import StepCosts
    from bench.twin.engine import MAX_RUNNING, Plan, VirtualClock, simulate
    from bench.twin.modes.static import EngineWide
    from bench.twin.modes.verify import BudgetedVerification
    from bench.twin.requests import TwinRequest
    from bench.twin.step_parts import StepParts

    case = _case(8)
    costs = StepCosts.of(case.profile, MAX_RUNNING).on_gateway()
    parts = StepParts(case.profile, MAX_RUNNING)
    requests = build_requests(case.workload, 1, 1.0)

    class Capped(EngineWide):
        """Every request at one cap, verified under the per-class budget."""

        engine_wide = False

        def __init__(self, cap: int) -> None:
            self.cap = cap
            self.verification = BudgetedVerification(
                parts, costs, pooled=False, skip_idle_drafter=True
            )

        def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
            return Plan(self.cap)

        def prefills_drafter(self, k: int) -> bool:
            return False

    idle = simulate(requests, Capped(0), costs, VirtualClock(), clients=1)
    assert all(r.draft_tokens == 0 for r in idle.records)
    # One request at a time, the drafter skipped: each decode step costs no_spec(1).
    tokens = sum(r.output_tokens for r in idle.records)
    prefill = sum(r.prompt_tokens for r in requests) * costs.prefill_target_s
    assert idle.makespan_s == pytest.approx(prefill + (tokens - len(requests)) * costs.no_spec[1])
    deep = simulate(requests, Capped(3), costs, VirtualClock(), clients=1)
    assert sum(r.draft_tokens for r in deep.records) > 0


def test_the_p99_check_reads_the_gateways_default_mode_for_the_engine() -> None:
    """On an engine verifying one depth per step the gateway's default is the step rule
    (`adaptive-step`), elsewhere `adaptive`: the Poisson p99 target is read for that mode."""
    from bench.twin.verify_summary import LOAD_ARRIVAL, default_mode, verify_checks

    def latency(p99: float) -> dict[str, object]:
        return {"class_latency": {"a": {"e2e_p99_s": p99}}}

    seeds = {"1": {"nospec": latency(1.0), "adaptive": latency(1.2), "adaptive-step": latency(1.0)}}
    arrivals = {LOAD_ARRIVAL: {"ratios": {}, "seeds": seeds}}
    for uniform, mode, ok in ((True, "adaptive-step", True), (False, "adaptive", False)):
        (check,) = verify_checks("p", "w", arrivals, default_mode(uniform))
        assert f": {mode}: worst class" in check["claim"]
        assert check["pass"] is ok
