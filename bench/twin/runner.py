"""Run every mode on the same requests for each (profile, workload, arrival, seed).

Per seed the request list (lengths, acceptance draws) is built once and replayed
by every mode under every arrival process; the oracle runs after the static
modes whose per-class results it reads. Each run is summarised at once
(`bench.twin.metrics`); only the first seed's records of the modes the plots
draw are kept. Before any run, the workload's classes are checked to reach
distinct controller classes (`check_classes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from bench.twin.costs import StepCosts
from bench.twin.engine import MAX_RUNNING, DepthSource, VirtualClock, simulate
from bench.twin.metrics import settle_points, summarise
from bench.twin.modes import (
    ADAPTIVE,
    ADAPTIVE_FLOOR,
    ADAPTIVE_STEP_FREE,
    CONTROLLED,
    GATEWAY_ENGINE,
    ORACLE,
    VERIFY_MODES,
    ModeContext,
    build,
    mode_names,
)
from bench.twin.modes.adaptive import AdaptiveControl
from bench.twin.modes.oracle import choose, oracle
from bench.twin.modes.static import NoSpec
from bench.twin.modes.trtllm import AcceptanceGate
from bench.twin.modes.verify import BudgetedVerification
from bench.twin.modes.vllm_schedule import BatchSchedule, ranges
from bench.twin.records import RequestRecord, RunResult
from bench.twin.requests import TwinRequest, arrival_times, build_requests, segments
from bench.twin.schema import ClosedArrival, PoissonArrival, Profile, TwinInputError, Workload
from engine.step_rule import expected_tokens
from gateway.control.classify import class_id_of
from gateway.control.features import (
    features_from_chat,
    features_from_completion,
    sampling_bucket,
)

#: Modes whose first-seed records the plots draw.
PLOTTED = (ADAPTIVE,)
#: Seeds the adaptive-verification modes run (the first ones): each costs about as much as
#: the rest of a seed's modes together, and the standard run must stay within 10 minutes.
VERIFY_SEEDS = 1
#: The controller's ablations (the batch floor on everywhere, the step rule without its
#: guard) run the first seed only too: the claims are checked on `adaptive` and
#: `adaptive-step` over every seed, and each ablation costs about a fifth of a seed's run.
ABLATIONS = (ADAPTIVE_FLOOR, ADAPTIVE_STEP_FREE)
ABLATION_SEEDS = 1


def seeds_run(mode: str, seeds: int) -> int:
    """How many of the first `seeds` seeds `mode` runs."""
    if mode in VERIFY_MODES:
        return min(seeds, VERIFY_SEEDS)
    if mode in ABLATIONS:
        return min(seeds, ABLATION_SEEDS)
    return seeds


@dataclass(frozen=True, slots=True)
class Case:
    """One profile with the workload it replays."""

    profile: Profile
    workload: Workload
    #: Modes run beside the standard ones (`bench.twin.modes.BENCH_SCHEDULE`).
    extra_modes: tuple[str, ...] = ()
    #: Lognormal sigma of each step's time (`StepCosts.with_noise`; 0: noiseless).
    step_noise: float = 0.0
    #: Log-spread of the host's slow speed drift (`StepCosts.with_noise`; 0: none).
    host_drift: float = 0.0
    #: Each class's confidence separation times this (`bench.twin.confidence`; 1: the
    #: workload's calibration, the sensitivity run's weaker and stronger signal else).
    confidence_scale: float = 1.0
    #: The goodput policy's queue weight in the controlled modes (0: none, the default).
    queue_weight: float = 0.0
    #: Requests the engine holds at once; the rest wait (and the plane sees them queued).
    max_running: int = MAX_RUNNING


@dataclass(slots=True)
class CaseRun:
    """A case's results: arrival label -> seed -> mode -> figures, plus what the report adds."""

    case: Case
    cells: dict[str, dict[int, dict[str, dict[str, Any]]]] = field(default_factory=dict)
    #: arrival -> seed -> mode -> stretches in order (`metrics.settle_points`).
    settle: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = field(default_factory=dict)
    #: The same for near-best settling (`metrics.settle_points` with a goodput).
    near_settle: dict[str, dict[int, dict[str, list[dict[str, Any]]]]] = field(default_factory=dict)
    #: arrival -> seed -> mode -> notes (drift alarms, the gate's trip, the schedule).
    notes: dict[str, dict[int, dict[str, dict[str, Any]]]] = field(default_factory=dict)
    #: arrival -> "class/phase" -> depth (first seed).
    oracle_choice: dict[str, dict[str, int]] = field(default_factory=dict)
    #: arrival -> mode -> records (first seed, `PLOTTED` modes and the deepest static).
    records: dict[str, dict[str, list[RequestRecord]]] = field(default_factory=dict)
    #: seed -> the no-speculation capacity in requests/s a `load` arrival reads.
    capacity_per_s: dict[int, float] = field(default_factory=dict)


def steady_goodput(
    requests: Sequence[TwinRequest], costs: StepCosts, max_k: int
) -> Callable[[RequestRecord], tuple[float, ...]]:
    """A finished request's steady goodput E[tokens | k] / step cost(k, its load) for
    k = 0..max_k, on its true acceptance and the median step costs (`metrics`: near-best
    settling)."""
    acceptance = {r.index: r.acceptance for r in requests}

    def goodput(record: RequestRecord) -> tuple[float, ...]:
        row = costs.spec[max(1, min(record.load, len(costs.spec) - 1))]
        expected = expected_tokens(acceptance[record.index], max_k)
        return tuple(expected[k] / row[k] for k in range(max_k + 1))

    return goodput


def check_classes(workload: Workload, requests: Sequence[TwinRequest]) -> None:
    """Fail, naming two workload classes, if the gateway's classifier puts requests of
    both into one class (their sample bodies and prompt lengths look alike to it)."""
    owner: dict[str, str] = {}
    for r in requests:
        spec = workload.classes[r.class_name]
        sampling = sampling_bucket(spec.temperature)
        if spec.endpoint == "chat":
            body = spec.request
            features = features_from_chat(
                body["messages"],
                body.get("tools"),
                body.get("tool_choice"),
                body.get("response_format"),
                r.prompt_tokens,
                None,
                sampling,
            )
        else:
            features = features_from_completion(
                spec.request["prompt"], r.prompt_tokens, None, sampling
            )
        cid = class_id_of(features)
        other = owner.setdefault(cid, r.class_name)
        if other != r.class_name:
            raise TwinInputError(
                f"workload {workload.name}: classes {other!r} and {r.class_name!r} reach the "
                f"same controller class {cid} (make their sample requests or prompt lengths differ)"
            )


def scaled(workload: Workload, total: int) -> Workload:
    """The workload with its phases' request counts scaled to about `total` in all."""
    factor = total / workload.total_requests
    phases = [
        p.model_copy(update={"requests": max(1, round(p.requests * factor))})
        for p in workload.phases
    ]
    return workload.model_copy(update={"phases": phases})


def rescaled(case: Case, total: int) -> Case:
    return replace(case, workload=scaled(case.workload, total))


def capacity_rate(
    requests: list[TwinRequest], costs: StepCosts, max_running: int = MAX_RUNNING
) -> float:
    """The engine's no-speculation capacity in requests/s: the `nospec` mode's completions
    per second with the engine full (`max_running` clients in a closed loop). A Poisson
    arrival given as a `load` arrives at that share of it."""
    result = simulate(
        requests, NoSpec(), costs, VirtualClock(), clients=max_running, max_running=max_running
    )
    return len(result.records) / result.makespan_s


def _notes(source: object) -> dict[str, Any]:
    verification: BudgetedVerification | None = getattr(source, "verification", None)
    if verification is not None:
        return verification.notes()
    if isinstance(source, AdaptiveControl):
        return {"drift_alarms": len(source.events.drifts)}
    if isinstance(source, AcceptanceGate):
        return {"gate_tripped_at_iteration": source.tripped_at, "threshold": source.threshold}
    if isinstance(source, BatchSchedule):
        return {"schedule": ranges(source.table)}
    return {}


def run_case(
    case: Case,
    seeds: Sequence[int],
    tick: Callable[[str], None] = lambda _: None,
    modes: Sequence[str] | None = None,
) -> CaseRun:
    """Every mode (or `modes`) on every arrival of the workload, for each seed."""
    profile, workload = case.profile, case.workload
    costs = StepCosts.of(profile, MAX_RUNNING)
    names = sorted(workload.classes)
    cuts = segments(workload)
    out = CaseRun(case)
    every = mode_names(profile.max_k, case.extra_modes)
    chosen = [m for m in every if modes is None or m in modes]
    deepest = f"static-k{profile.max_k}"
    median_costs = costs
    for s, seed in enumerate(seeds):
        # One jitter sequence per seed, the same for every mode (common random numbers).
        costs = median_costs.with_noise(case.step_noise, seed, case.host_drift)
        on_gateway = costs.on_gateway()
        # The confidence draws only where a mode reads them (their own stream: the
        # other draws are the same either way).
        verifies = s < VERIFY_SEEDS and any(m in VERIFY_MODES for m in chosen)
        requests = build_requests(workload, seed, case.confidence_scale if verifies else None)
        check_classes(workload, requests)
        by_load = any(isinstance(a, PoissonArrival) and a.load for a in workload.arrivals)
        capacity = capacity_rate(requests, costs, case.max_running) if by_load else None
        if capacity is not None:
            out.capacity_per_s[seed] = capacity
        # Settling is read for the gateway's modes, on its engine's costs.
        goodput = steady_goodput(requests, median_costs.on_gateway(), profile.max_k)
        for arrival in workload.arrivals:
            label = arrival.label
            times = arrival_times(arrival, len(requests), seed, capacity)
            clients = arrival.concurrency if isinstance(arrival, ClosedArrival) else 1
            results: dict[str, RunResult] = {}
            for mode in chosen:
                if s >= seeds_run(mode, len(seeds)):
                    continue
                tick(f"{profile.name} {label} seed {seed} {mode}")
                clock = VirtualClock()
                engine_costs = on_gateway if mode in GATEWAY_ENGINE else costs
                ctx = ModeContext(profile, workload, engine_costs, clock, seed, case.queue_weight)
                source: DepthSource
                if mode == ORACLE:
                    choice = choose(results)
                    source = oracle(choice)
                    if s == 0:
                        out.oracle_choice[label] = {
                            f"{names[c]}/{workload.phases[p].name}": k
                            for (c, p), k in sorted(choice.items())
                        }
                else:
                    source = build(mode, ctx)
                result = simulate(
                    requests,
                    source,
                    engine_costs,
                    clock,
                    times=times,
                    clients=clients,
                    max_running=case.max_running,
                )
                results[mode] = result
                cell = out.cells.setdefault(label, {}).setdefault(seed, {})
                cell[mode] = summarise(result, names, isinstance(arrival, PoissonArrival))
                note = _notes(source)
                if note:
                    out.notes.setdefault(label, {}).setdefault(seed, {})[mode] = note
                if mode in CONTROLLED:
                    settle = settle_points(result.records, cuts, names)
                    out.settle.setdefault(label, {}).setdefault(seed, {})[mode] = settle
                    near = settle_points(result.records, cuts, names, goodput)
                    out.near_settle.setdefault(label, {}).setdefault(seed, {})[mode] = near
                if s == 0 and (mode in PLOTTED or mode == deepest):
                    out.records.setdefault(label, {})[mode] = result.records
            results.clear()
    return out


def count_runs(cases: Sequence[Case], seeds: int, modes: Sequence[str] | None = None) -> int:
    """Runs `run_case` will make over `cases` (the progress bar's total)."""
    total = 0
    for c in cases:
        for m in mode_names(c.profile.max_k, c.extra_modes):
            if modes is None or m in modes:
                total += seeds_run(m, seeds) * len(c.workload.arrivals)
    return total
