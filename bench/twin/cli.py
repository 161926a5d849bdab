"""`python -m bench twin`: run the engine twin and write summary, report and plots.

With no `--profile`, every shipped profile (`bench/twin/profiles/*.json`) runs its
own workload (`bench/twin/workloads/<name>.json`): the one its `workload` field
names, else `make-bench` for `cpu-embedded` and `production-mix` for the others.
`--workload` given once applies to every profile, given as often as `--profile`
pairs with them in order. `--quick` is the CI size: one profile, 120 requests,
the workload's first and last arrival, one seed.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from bench.twin.schema import Profile, TwinInputError, Workload, load_profile, load_workload

if TYPE_CHECKING:
    from bench.twin.runner import Case, CaseRun

TWIN = Path(__file__).resolve().parent
REPO = TWIN.parents[1]
PROFILES = TWIN / "profiles"
WORKLOADS = TWIN / "workloads"
#: The real `make bench` run the `cpu-embedded` profile and `make-bench` workload come from.
REAL_SUMMARY = REPO / "bench" / "twin" / "measurements" / "make-bench-cpu-embedded.json"
DEFAULT_OUT = REPO / "bench" / "results" / "twin"
#: Where the real engine's verify-budget run is looked for (`validation.real_verify_rows`).
REAL_RESULTS = REPO / "bench" / "results"
QUICK_REQUESTS = 120
#: Default lognormal sigma of each step's time (`StepCosts.with_noise`): a real engine's
#: step times spread (scheduling, allocator, clocks), and a controller tuned on exact
#: times would not meet them. 0.05 = a 5 % log-spread, modest for a GPU step.
DEFAULT_STEP_NOISE = 0.05
#: Default workload of the profile measured on this repository's CPU engine.
CPU_PROFILE, CPU_WORKLOAD, GPU_WORKLOAD = "cpu-embedded", "make-bench", "production-mix"
#: The twin engine's default admission limit (vLLM's `max_num_seqs`, `bench.twin.engine`).
MAX_RUNNING = 256

app = typer.Typer(help="The engine twin: simulated GPU economics driving the real controller.")


def default_workload(profile: Profile) -> str:
    if profile.workload:
        return profile.workload
    return CPU_WORKLOAD if profile.name == CPU_PROFILE else GPU_WORKLOAD


def select_cases(profiles: Sequence[Path], workloads: Sequence[Path]) -> list[Case]:
    """The (profile, workload) pairs a run covers (module docstring)."""
    from bench.twin.modes import BENCH_SCHEDULE
    from bench.twin.runner import Case

    paths = list(profiles) or sorted(PROFILES.glob("*.json"))
    if not paths:
        raise TwinInputError(f"no profiles given and none in {PROFILES}")
    loaded = [load_profile(p) for p in paths]
    if workloads and len(workloads) not in (1, len(loaded)):
        raise TwinInputError(
            f"{len(workloads)} workloads for {len(loaded)} profiles: give one, or one per profile"
        )
    cases = []
    for i, profile in enumerate(loaded):
        if workloads:
            path = workloads[0] if len(workloads) == 1 else workloads[i]
        else:
            path = WORKLOADS / f"{default_workload(profile)}.json"
        extra = (BENCH_SCHEDULE,) if profile.name == CPU_PROFILE else ()
        cases.append(Case(profile, load_workload(path), extra))
    return cases


def quick_cases(cases: Sequence[Case]) -> list[Case]:
    """One profile, `QUICK_REQUESTS` requests, the first and last arrival."""
    from bench.twin.runner import scaled

    case = cases[0]
    workload: Workload = scaled(case.workload, QUICK_REQUESTS)
    arrivals = workload.arrivals
    picked = [arrivals[0], arrivals[-1]] if len(arrivals) > 1 else list(arrivals)
    return [replace(case, workload=workload.model_copy(update={"arrivals": picked}))]


def run_all(
    cases: Sequence[Case],
    seeds: Sequence[int],
    modes: Sequence[str] | None = None,
    jobs: int = 1,
) -> list[CaseRun]:
    """Every case in order; `jobs` > 1 runs the cases in that many processes (each case
    is independent of the others, so the results are the same)."""
    from tqdm import tqdm

    from bench.twin.runner import count_runs, run_case

    if jobs > 1 and len(cases) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=min(jobs, len(cases))) as pool:
            futures = [pool.submit(run_case, case, seeds, modes=modes) for case in cases]
            with tqdm(total=len(cases), unit="case", desc="twin") as bar:
                done = []
                for future in futures:
                    done.append(future.result())
                    bar.update(1)
        return done
    runs = []
    with tqdm(total=count_runs(cases, len(seeds), modes), unit="run", desc="twin") as bar:

        def tick(label: str) -> None:
            bar.set_postfix_str(label, refresh=False)
            bar.update(1)

        for case in cases:
            runs.append(run_case(case, seeds, tick, modes))
    return runs


def write(
    out: Path,
    runs: Sequence[CaseRun],
    seeds: Sequence[int],
    started: float,
    simulated: float,
    simulated_cpu: float,
) -> None:
    """summary.json, the PNGs, report.md and run.json (times: not in the summary, which
    stays byte-identical for one seed's inputs) into `out`. `simulated_cpu` is the
    process's CPU time for the simulation: the twin is single-threaded, so it is the time
    on one core of its own whatever else shares the machine."""
    from bench.twin.plots import write_plots
    from bench.twin.report import render
    from bench.twin.summary import build_summary

    out.mkdir(parents=True, exist_ok=True)
    summary = build_summary(runs, seeds)
    checked = checked_against_real(summary)
    if checked is not None:
        summary = build_summary(runs, seeds, checked)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    write_plots(summary, runs, out)
    per_run = {r.case.profile.name: r.case.workload.total_requests for r in runs}
    replays = {
        r.case.profile.name: sum(
            len(modes) for seeds_ in r.cells.values() for modes in seeds_.values()
        )
        for r in runs
    }
    info = {
        "runs": sum(replays.values()),
        "requests": sum(per_run[name] * n for name, n in replays.items()),
        "per_run": ", ".join(f"{n}: {k} per run" for n, k in per_run.items()),
        "simulation_wall_s": round(simulated, 1),
        "simulation_cpu_s": round(simulated_cpu, 1),
        "total_wall_s": round(time.perf_counter() - started, 1),
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    (out / "report.md").write_text(render(summary, info) + "\n")
    (out / "run.json").write_text(json.dumps(info, indent=1) + "\n")
    typer.echo(f"twin: {info['runs']} runs, simulated in {simulated:.1f} s; {out / 'report.md'}")


def checked_against_real(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The validation against the real-engine runs (`bench.twin.validation`): the
    `make bench` run, and the verify budget's `bench.floor_interleaved` run."""
    from bench.twin.validation import validate, validate_verify

    checked = validate(summary["profiles"], REAL_SUMMARY)
    verify = validate_verify(summary["profiles"], REAL_RESULTS)
    if checked is not None and verify is not None:
        checked["budget"] = verify
    return checked


@app.command("revalidate")
def revalidate(
    out: Annotated[Path, typer.Option(help="Results directory of a run.")] = DEFAULT_OUT,
) -> None:
    """Set a run's summary beside the real-engine runs as they are now, read its
    adaptive-verification targets again (`verify_summary.verify_checks`, for each shipped
    profile) and render its report again; nothing is simulated."""
    from bench.twin.report import render
    from bench.twin.summary import rounded
    from bench.twin.verify_summary import default_mode, verify_checks

    summary = json.loads((out / "summary.json").read_text())
    for name, entry in summary["profiles"].items():
        path = PROFILES / f"{name}.json"
        workload = WORKLOADS / f"{entry['workload']}.json"
        if workload.exists():  # the run's order of arrivals (the file's keys are sorted)
            order = [a.label for a in load_workload(workload).arrivals]
            arrivals = entry["arrivals"]
            ranked = sorted(arrivals, key=lambda a: order.index(a) if a in order else len(order))
            entry["arrivals"] = {a: arrivals[a] for a in ranked}
        if path.exists():
            uniform = load_profile(path).batch_depth == "uniform"
            checks = verify_checks(
                name, entry["workload"], entry["arrivals"], default_mode(uniform)
            )
            entry["verify_checks"] = rounded(checks)
    checked = checked_against_real(summary)
    if checked is not None:
        summary["validation"] = rounded(checked)
    info = json.loads((out / "run.json").read_text())
    (out / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    (out / "report.md").write_text(render(summary, info) + "\n")
    typer.echo(f"twin: validation of {out / 'summary.json'} renewed")


@app.callback(invoke_without_command=True)
def twin(
    ctx: typer.Context,
    profile: Annotated[
        list[Path] | None, typer.Option("--profile", help="Cost profile JSON (repeatable).")
    ] = None,
    workload: Annotated[
        list[Path] | None, typer.Option("--workload", help="Workload JSON (repeatable).")
    ] = None,
    seeds: Annotated[int, typer.Option(help="Seeds to run (the spread is over them).")] = 2,
    seed: Annotated[int, typer.Option(help="First seed.")] = 1234,
    requests: Annotated[
        int | None, typer.Option(help="Scale each workload to about this many requests.")
    ] = None,
    quick: Annotated[bool, typer.Option(help=f"CI size: {QUICK_REQUESTS} requests.")] = False,
    step_noise: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Lognormal sigma of each step's time (seeded, the same for every mode; 0: none).",
        ),
    ] = DEFAULT_STEP_NOISE,
    host_drift: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Log-spread of a slow drift of the host's speed, correlated over about "
            "10,000 steps (seeded, the same for every mode; 0: a host of constant speed).",
        ),
    ] = 0.0,
    confidence_scale: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=4.0,
            help="Multiply every class's confidence separation (bench.twin.confidence): the "
            "sensitivity run of adaptive verification (0: no signal, 0.5 weaker, 2 stronger).",
        ),
    ] = 1.0,
    modes: Annotated[
        str | None,
        typer.Option(help="Run only these modes (comma-separated; the oracle needs the statics)."),
    ] = None,
    arrivals: Annotated[
        str | None,
        typer.Option(help="Run only these arrivals (comma-separated labels, e.g. c1,c4)."),
    ] = None,
    jobs: Annotated[
        int,
        typer.Option(min=1, max=64, help="Processes to run the profiles in (same results)."),
    ] = 1,
    queue_weight: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=16.0,
            help="The goodput policy's queue weight in the controlled modes (0: none, the "
            "gateway's default; gateway.control.policies.goodput).",
        ),
    ] = 0.0,
    max_running: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_RUNNING,
            help="Requests the engine holds at once; later arrivals wait (the plane sees "
            "them queued), the no-speculation capacity is measured at this size.",
        ),
    ] = MAX_RUNNING,
    sensitivity: Annotated[
        bool,
        typer.Option(
            help="Instead of the standard run: gateway-av against vllm-av as the classes' "
            "calibrations differ more and the signal weakens or strengthens "
            "(bench.twin.sensitivity); writes sensitivity.json/.md/.png into --out."
        ),
    ] = False,
    out: Annotated[Path, typer.Option(help="Results directory.")] = DEFAULT_OUT,
) -> None:
    """Replay each profile's workload through every mode; write summary, report, plots."""
    if ctx.invoked_subcommand is not None:
        return
    from bench.twin.runner import rescaled

    try:
        cases = select_cases(profile or [], workload or [])
    except TwinInputError as exc:
        raise typer.BadParameter(str(exc)) from None
    cases = [
        replace(
            c,
            step_noise=step_noise,
            host_drift=host_drift,
            confidence_scale=confidence_scale,
            queue_weight=queue_weight,
            max_running=max_running,
        )
        for c in cases
    ]
    if requests:
        cases = [rescaled(c, requests) for c in cases]
    if arrivals:
        labels = arrivals.split(",")
        cases = [
            replace(
                c,
                workload=c.workload.model_copy(
                    update={"arrivals": [a for a in c.workload.arrivals if a.label in labels]}
                ),
            )
            for c in cases
        ]
    chosen = [seed] if quick else [seed + i for i in range(seeds)]
    if quick:
        cases = quick_cases(cases)
    started, cpu = time.perf_counter(), _cpu_s()
    if sensitivity:
        from bench.twin import sensitivity as sensitivity_run

        result = sensitivity_run.run(cases, chosen)
        result["cpu_s"] = round(_cpu_s() - cpu, 1)
        sensitivity_run.write(result, out)
        typer.echo(f"twin sensitivity: {len(result['rows'])} rows; {out / 'sensitivity.md'}")
        return
    runs = run_all(cases, chosen, modes.split(",") if modes else None, jobs)
    write(out, runs, chosen, started, time.perf_counter() - started, _cpu_s() - cpu)


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (`--jobs`)."""
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


@app.command("from-run")
def from_run(
    runs: Annotated[Path, typer.Argument(help="A benchmark run's runs.jsonl.")],
    out: Annotated[Path, typer.Option(help="Workload JSON to write.")],
    name: Annotated[str | None, typer.Option(help="Workload name (default: file stem).")] = None,
    poisson: Annotated[
        float | None, typer.Option(help="Also replay open-loop at this rate (requests/s).")
    ] = None,
) -> None:
    """Write a workload from a real run (`bench.twin.build_workload`)."""
    from bench.twin import build_workload

    build_workload.main(out=out, from_run_path=runs, name=name, poisson=poisson)


@app.command("from-classes")
def from_classes(
    classes: Annotated[Path, typer.Argument(help="A saved GET /admin/classes answer.")],
    out: Annotated[Path, typer.Option(help="Workload JSON to write.")],
    name: Annotated[str | None, typer.Option(help="Workload name (default: file stem).")] = None,
    poisson: Annotated[
        float | None, typer.Option(help="Also replay open-loop at this rate (requests/s).")
    ] = None,
) -> None:
    """Write a workload from a gateway's per-class depth profiles (`bench.twin.build_workload`)."""
    from bench.twin import build_workload

    build_workload.main(out=out, from_classes_path=classes, name=name, poisson=poisson)


@app.command("profile")
def profile_from(
    out: Annotated[Path, typer.Option(help="Profile JSON to write.")],
    admin_costs: Annotated[
        str | None, typer.Option(help="/admin/costs: a URL or a saved answer.")
    ] = None,
    vllm_profile: Annotated[
        Path | None, typer.Option(help="vLLM's dynamic-SD profiler output (JSON).")
    ] = None,
) -> None:
    """Write a cost profile from /admin/costs or vLLM's profiler (`bench.twin.build_profile`;
    `python -m bench.twin.build_profile --help` for its other options)."""
    from bench.twin import build_profile

    build_profile.main(out=out, admin_costs=admin_costs, vllm_profile=vllm_profile)
