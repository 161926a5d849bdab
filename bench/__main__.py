"""`python -m bench run [--quick]`: the mixed-traffic replay; `report` re-renders a run.

Sizes are chosen so that a 2-core CPU machine is enough: the full run (`make bench`) takes tens
of minutes, the quick run (`make bench-quick`, CI) a few, with tiny counts and
one repeat, and checks only that the harness produces a well-formed report.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer

from bench.families import load_pool
from bench.modes import (
    BATCH_SCHEDULE_FIELD,
    ab_modes,
    batch_schedule_supported,
    default_modes,
    select_modes,
)
from bench.twin.cli import app as twin_app
from bench.workload import Arrival, ClosedLoop, Phase, Poisson, build_workload, default_phases

app = typer.Typer(help="spec-gateway benchmark harness.", no_args_is_help=True)
app.add_typer(twin_app, name="twin")
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Size:
    per_phase: int
    max_tokens: int
    repeats: int
    arrivals: list[Arrival]
    modes: list[str] | None
    batch_schedule: bool
    latency_n: int
    ceiling_s: float
    #: Start-up calibration batch sizes; None: `RunPlan.gateway_env`'s rule.
    calibrate_batches: list[int] | None = None


# Full: 9 modes x 4 arrivals x 3 repeats x 36 requests (3,888 requests of up to 32
# tokens); about 18 minutes on 2 shared CPU cores with the embedded model (`make bench`).
FULL = Size(
    per_phase=12,
    max_tokens=32,
    repeats=3,
    arrivals=[ClosedLoop(1), ClosedLoop(4), ClosedLoop(16), Poisson(3.0, seed=7)],
    modes=None,
    batch_schedule=True,
    latency_n=1000,
    ceiling_s=15.0,
)
QUICK = Size(
    per_phase=4,
    max_tokens=16,
    repeats=1,
    arrivals=[ClosedLoop(4)],
    modes=["no-spec", "k0", "static-k1", "static-k2", "adaptive"],
    batch_schedule=False,
    latency_n=50,
    ceiling_s=2.0,
    # A check of the harness, 12 requests a mode: batch 1 alone is timed (2 and 4 would add
    # about a minute to each speculative gateway's start); the others come from the shape.
    calibrate_batches=[1],
)


def select_arrivals(available: list[Arrival], names: list[str] | None) -> list[Arrival]:
    """The arrivals named (by label: c1, c4, c16, poisson3), in the plan's order."""
    if not names:
        return available
    unknown = sorted(set(names) - {a.label for a in available})
    if unknown:
        labels = ", ".join(a.label for a in available)
        raise typer.BadParameter(f"unknown arrival {', '.join(unknown)} (have: {labels})")
    return [a for a in available if a.label in names]


def _meta(
    size: Size, phases: list[Phase], seed: int, model_source: str, families_source: str
) -> dict[str, Any]:
    return {
        "started": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": f"{os.cpu_count()} CPUs, {platform.machine()}, {platform.system()}",
        "model_source": model_source,
        "families_source": families_source,
        "seed": seed,
        "phases": ", ".join(f"{p.name} x{p.requests}" for p in phases),
        "requests_per_run": sum(p.requests for p in phases),
        "max_tokens": size.max_tokens,
        "repeats": size.repeats,
        "arrivals": [a.label for a in size.arrivals],
        "notes": [],
        "loadavg_start": round(os.getloadavg()[0], 2),
    }


@app.command()
def run(
    quick: Annotated[bool, typer.Option(help="Tiny counts, one repeat (CI).")] = False,
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
    seed: Annotated[int, typer.Option(help="Workload seed.")] = 1234,
    max_depth: Annotated[int, typer.Option(help="K of the speculative engine.")] = 4,
    modes: Annotated[
        list[str] | None, typer.Option("--mode", help="Run only these modes (repeatable).")
    ] = None,
    repeats: Annotated[int | None, typer.Option(help="Override the repeat count.")] = None,
    per_phase: Annotated[int | None, typer.Option(help="Override requests per phase.")] = None,
    max_tokens: Annotated[int | None, typer.Option(help="Override max_tokens.")] = None,
    publish: Annotated[
        bool | None, typer.Option(help="Copy the report into bench/results/ (default: full runs).")
    ] = None,
    overhead: Annotated[
        bool, typer.Option(help="Also measure the gateway's overhead on a no-op engine.")
    ] = True,
    arrivals: Annotated[
        list[str] | None,
        typer.Option("--arrival", help="Run only these arrivals, e.g. c4 (repeatable)."),
    ] = None,
) -> None:
    """Replay the mixed workload through every mode; write runs, summary, report and plots."""
    from bench.families import fit_pool
    from bench.gateway_proc import model_paths
    from bench.runner import JsonlSink, RunPlan, run_all
    from engine.settings import EngineSettings

    size = QUICK if quick else FULL
    size = replace(
        size,
        per_phase=per_phase or size.per_phase,
        max_tokens=max_tokens or size.max_tokens,
        repeats=repeats or size.repeats,
        arrivals=select_arrivals(size.arrivals, arrivals),
    )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = out or REPO / "results" / "bench" / stamp
    out_dir.mkdir(parents=True, exist_ok=True)
    models = model_paths(Path(os.environ.get("SPECGW_TEST_MODELS", "/tmp/specgw-tiny")))
    pool, families_source = load_pool(per_family=16, seed=seed)
    max_len = EngineSettings().max_model_len
    pool, dropped = fit_pool(pool, models.target, max_len, size.max_tokens)
    phases = default_phases(size.per_phase)
    items = build_workload(phases, pool, seed, size.max_tokens)
    schedule = size.batch_schedule and batch_schedule_supported()
    chosen = select_modes(
        default_modes(max_depth, batch_schedule=schedule), modes or size.modes, ab_modes(max_depth)
    )
    plan = RunPlan(
        chosen, size.arrivals, size.repeats, items, calibrate_batches=size.calibrate_batches
    )
    meta = _meta(size, phases, seed, models.source, families_source)
    meta["repeats"] = plan.repeats
    meta["modes"] = [m.name for m in chosen]
    if dropped:
        meta["notes"].append(
            f"{dropped} pool prompts did not fit max_model_len {max_len} with "
            f"max_tokens {size.max_tokens} in this model's tokenizer and were left out"
        )
    if size.batch_schedule and not schedule:
        meta["notes"].append(
            "batch-schedule mode not run: EngineSettings has no "
            f"`{BATCH_SCHEDULE_FIELD}` field to pass vLLM's num_speculative_tokens_per_batch_size"
        )
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    t0 = time.monotonic()
    sink = JsonlSink(out_dir / "runs.jsonl")
    notes = run_all(plan, models, out_dir, sink)
    if overhead:
        from bench.overhead import measure_overhead

        try:
            measure_overhead(models.target, out_dir, size.latency_n, size.ceiling_s)
        except RuntimeError as exc:
            notes.append(f"overhead not measured: {str(exc)[-600:]}")
    meta["duration_s"] = time.monotonic() - t0
    meta["loadavg_end"] = round(os.getloadavg()[0], 2)
    meta["notes"] = [*meta["notes"], *notes]
    (out_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    _render(out_dir, publish if publish is not None else not quick)


@app.command("overhead")
def overhead_command(
    out: Annotated[Path | None, typer.Option(help="Results directory.")] = None,
    latency_n: Annotated[int, typer.Option(help="Requests for the latency figure.")] = 1000,
    ceiling_s: Annotated[float, typer.Option(help="Seconds per ceiling measurement.")] = 15.0,
) -> None:
    """Only the gateway overhead: added latency and requests/s per core on a no-op engine."""
    from bench.gateway_proc import model_paths
    from bench.overhead import measure_overhead

    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out_dir = out or REPO / "results" / "bench" / f"overhead-{stamp}"
    out_dir.mkdir(parents=True, exist_ok=True)
    models = model_paths(Path(os.environ.get("SPECGW_TEST_MODELS", "/tmp/specgw-tiny")))
    result = measure_overhead(models.target, out_dir, latency_n, ceiling_s)
    typer.echo(json.dumps(result, indent=1))


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="A results directory with runs.jsonl.")],
    publish: Annotated[bool, typer.Option(help="Copy the report into bench/results/.")] = False,
) -> None:
    """Re-render summary, report and plots from a run directory's `runs.jsonl`."""
    _render(run_dir, publish)


def _render(out_dir: Path, publish: bool) -> None:
    from bench.plots import write_plots
    from bench.render import write_report
    from bench.report import build_summary
    from bench.runner import load_cost_models, load_runs

    runs = load_runs(out_dir / "runs.jsonl")
    meta = json.loads((out_dir / "meta.json").read_text())
    overhead_path = out_dir / "overhead.json"
    overhead = json.loads(overhead_path.read_text()) if overhead_path.exists() else None
    summary = build_summary(runs, meta, overhead, load_cost_models(out_dir))
    paths = [*write_report(summary, out_dir), *write_plots(summary, runs, out_dir)]
    if overhead is not None:
        paths.append(overhead_path)
    typer.echo(f"report: {out_dir / 'report.md'}")
    if publish:
        dest = REPO / "bench" / "results"
        dest.mkdir(exist_ok=True)
        for p in paths:
            shutil.copy2(p, dest / p.name)
        typer.echo(f"published to {dest}")


if __name__ == "__main__":
    app()
