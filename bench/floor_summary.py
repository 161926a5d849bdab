"""The statistics and tables of a `bench.floor_interleaved` run: each request paired with
the same request of the no-drafter engine's run of its burst, medians of the ratios with a
bootstrap over whole bursts, per concurrency and per prompt family, the k = 0 plot, and the
attribution table of a profiled run (`bench.floor_timers`' totals)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.stats import bootstrap_interval

BASE = "no drafter"
NULL = "no drafter (again)"
#: Timer totals of a profiled engine: {phase: {component: [seconds, calls]}}.
Totals = dict[str, dict[str, list[float]]]
#: What vLLM loads for a profiled engine (`EngineSettings.extra_args`).
PROFILED = {
    "worker_extension_cls": "bench.floor_timers.FloorProfileWorker",
    "scheduler_cls": "bench.floor_timers.FloorProfileScheduler",
}
#: Rows of the table, in order: (component, what it is).
ROWS: tuple[tuple[str, str], ...] = (
    ("core.step", "engine core step, all of it"),
    ("core.schedule", "scheduler (depth cap) schedule()"),
    ("core.update_from_output", "update_from_output (+ step clock, per-request metrics)"),
    ("core.post_step", "draft pickup after the step"),
    ("executor+ipc", "core.step - schedule - update - worker calls"),
    ("execute_model", "worker: execute_model"),
    ("_update_states", "  persistent batch update"),
    ("_prepare_inputs", "  input preparation"),
    ("_calc_spec_decode_metadata", "    spec-decode metadata"),
    ("_get_slot_mappings", "  slot mappings"),
    ("_build_attention_metadata", "  attention metadata"),
    ("_preprocess", "  input ids / embeddings"),
    ("_model_forward", "  target forward"),
    ("aux_hidden_capture", "    EAGLE-3 aux hidden-state capture"),
    ("sample_tokens", "worker: sample_tokens"),
    ("_sample", "  sampler / rejection sampler"),
    ("_bookkeeping_sync", "  output bookkeeping"),
    ("propose_draft_token_ids", "  drafter (prefill KV pass and drafts)"),
    ("take_draft_token_ids", "worker: take_draft_token_ids"),
)
PHASES = ("prefill", "decode")

#: The figures read per request (seconds), and per burst.
METRICS = ("ttft_start", "ttft_join", "tpot", "cpu_per_token")


@dataclass
class BurstRun:
    """One variant's run of one burst: per request position, its figures (None where the
    position does not have one: the joiner has no starter TTFT and the reverse)."""

    ttft_start: list[float | None] = field(default_factory=list)
    ttft_join: list[float | None] = field(default_factory=list)
    tpot: list[float | None] = field(default_factory=list)
    cpu_per_token: list[float | None] = field(default_factory=list)
    #: Each request's output tokens as a digest (`bench.floor_versus`; "" where not kept).
    digests: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Plan:
    """What every variant of one burst runs: the prompts and reply lengths, in order; the
    last one joins the others' batch (alone at concurrency 1)."""

    texts: tuple[str, ...]
    lengths: tuple[int, ...]
    #: Each request's prompt family (`bench.families`).
    families: tuple[str, ...] = ()


def paired_ratios(base: Sequence[float | None], other: Sequence[float | None]) -> list[float]:
    """other / base per position where both have a positive figure."""
    return [o / b for b, o in zip(base, other, strict=True) if b and o and b > 0 and o > 0]


def median_ratio(bursts: Sequence[list[float]]) -> float:
    """Median over the requests of all `bursts` of their ratios (NaN with none)."""
    pooled = [r for burst in bursts for r in burst]
    return statistics.median(pooled) if pooled else math.nan


def ratio_cell(per_burst: Sequence[list[float]]) -> dict[str, Any]:
    """The median ratio over the bursts' requests, its 95 % interval from a bootstrap over
    whole bursts, and the number of requests."""
    low, high = bootstrap_interval(per_burst, median_ratio)
    return {
        "ratio": round(median_ratio(per_burst), 4),
        "ci95": [round(low, 4), round(high, 4)],
        "n": sum(len(r) for r in per_burst),
    }


def summarise(
    runs: dict[tuple[int, str], list[BurstRun]], concurrency: Sequence[int], names: Sequence[str]
) -> list[dict[str, Any]]:
    """Per concurrency and variant but A: per metric, the median ratio to A's run of the
    same burst, its burst-bootstrap 95 % interval, both engines' median ms and n."""
    rows = []
    for conc in concurrency:
        base = runs[(conc, BASE)]
        for name in names:
            if name == BASE:
                continue
            mine = runs[(conc, name)]
            row: dict[str, Any] = {"concurrency": conc, "variant": name, "bursts": len(mine)}
            for metric in METRICS:
                per_burst = [
                    paired_ratios(getattr(a, metric), getattr(b, metric))
                    for a, b in zip(base, mine, strict=True)
                ]
                per_burst = [r for r in per_burst if r]
                if per_burst:
                    row[metric] = {
                        **ratio_cell(per_burst),
                        "a_ms": _median_ms(base, metric),
                        "b_ms": _median_ms(mine, metric),
                    }
            rows.append(row)
    return rows


def ttfts(run: BurstRun) -> list[float | None]:
    """Each request's TTFT, starter or joiner."""
    return [a if a is not None else b for a, b in zip(run.ttft_start, run.ttft_join, strict=True)]


def _tpots(run: BurstRun) -> list[float | None]:
    return run.tpot


#: What the family table reads of a burst run, per request.
READS: dict[str, Callable[[BurstRun], list[float | None]]] = {"ttft": ttfts, "tpot": _tpots}


def _kept(values: Sequence[float | None], keep: Sequence[bool]) -> list[float | None]:
    return [v for v, k in zip(values, keep, strict=True) if k]


def by_family(
    runs: dict[tuple[int, str], list[BurstRun]],
    plans: dict[int, list[Plan]],
    names: Sequence[str],
) -> list[dict[str, Any]]:
    """Per prompt family and variant but A, over every concurrency: the median ratio to
    A's run of the same burst for TTFT (starter or joiner) and TPOT, with a bootstrap
    over the bursts the family's requests came in."""
    families = sorted({f for ps in plans.values() for p in ps for f in p.families})
    rows = []
    for family in families:
        for name in names:
            if name == BASE:
                continue
            row: dict[str, Any] = {"family": family, "variant": name}
            for metric, read in READS.items():
                per_burst = []
                for conc, conc_plans in plans.items():
                    for plan, a, b in zip(
                        conc_plans, runs[(conc, BASE)], runs[(conc, name)], strict=True
                    ):
                        keep = [f == family for f in plan.families]
                        ratios = paired_ratios(_kept(read(a), keep), _kept(read(b), keep))
                        if ratios:
                            per_burst.append(ratios)
                if per_burst:
                    row[metric] = ratio_cell(per_burst)
            rows.append(row)
    return rows


def family_table(rows: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "by prompt family, every concurrency pooled: ratio to the no-drafter engine's run "
        "of the same burst, median over requests [95 %, bootstrap over bursts]",
        "| family | variant | TTFT | TPOT | requests |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        n = r.get("tpot", {}).get("n", 0)
        lines.append(
            f"| {r['family']} | {r['variant']} | {cell(r, 'ttft')} | {cell(r, 'tpot')} | {n} |"
        )
    return lines


def _median_ms(runs: Sequence[BurstRun], metric: str) -> float:
    values = [v for run in runs for v in getattr(run, metric) if v]
    return round(1e3 * statistics.median(values), 3) if values else math.nan


def cell(row: dict[str, Any], metric: str) -> str:
    f = row.get(metric)
    if f is None:
        return "-"
    return f"{f['ratio']:.3f} [{f['ci95'][0]:.3f}-{f['ci95'][1]:.3f}]"


def table(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The printed table: one line per concurrency and variant."""
    lines = [
        "ratio to the no-drafter engine's run of the same burst: median over requests "
        "[95 % interval, bootstrap over bursts]",
        "| c | variant | bursts | TTFT (starters) | TTFT (joiner) | TPOT | CPU/token "
        "| TPOT ms A / B |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = " | ".join(cell(r, m) for m in METRICS)
        tpot = r.get("tpot", {})
        ms = f"{tpot.get('a_ms', math.nan):.2f} / {tpot.get('b_ms', math.nan):.2f}"
        lines.append(f"| {r['concurrency']} | {r['variant']} | {r['bursts']} | {cells} | {ms} |")
    return lines


def plot(rows: Sequence[dict[str, Any]], path: Path, target: float = 1.03) -> Path:
    """The k = 0 rows and the A/A null as points with their intervals, TTFT (joiner or
    alone) and TPOT side by side, the target drawn; k > 0 rows are left to the table
    (their ratios, up to 2x, would flatten the scale the floor is read at)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["variant"] == NULL or r["variant"].endswith("k = 0")]
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.5 * len(shown) + 1.8), sharey=True)
    labels = [f"c{r['concurrency']} {r['variant']} ({r['bursts']} bursts)" for r in shown]
    for ax, (metric, title) in zip(
        axes, (("ttft_join", "TTFT (alone or joining)"), ("tpot", "TPOT")), strict=True
    ):
        for y, row in enumerate(shown):
            f = row[metric]
            colour = "tab:gray" if row["variant"] == NULL else "tab:blue"
            low, high = f["ci95"]
            ax.errorbar(
                f["ratio"],
                y,
                xerr=[[f["ratio"] - low], [high - f["ratio"]]],
                fmt="o",
                color=colour,
                capsize=3,
            )
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.axvline(target, color="tab:red", linestyle="--", linewidth=0.8)
        ax.set_title(title)
        ax.set_xlabel("ratio to the no-drafter engine (95 % interval)")
    axes[0].set_yticks(range(len(shown)), labels)
    axes[0].invert_yaxis()
    fig.suptitle("k = 0 on the speculative engine against no drafter, request by request")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


@dataclass
class Case:
    """One column of the table: a variant, with its timers summed over its bursts."""

    name: str
    totals: Totals = field(default_factory=dict)

    def absorb(self, totals: Iterable[Totals]) -> None:
        for part in totals:
            for phase, components in part.items():
                mine = self.totals.setdefault(phase, {})
                for name, (seconds, calls) in components.items():
                    cell = mine.setdefault(name, [0.0, 0.0])
                    cell[0] += seconds
                    cell[1] += calls

    def steps(self, phase: str) -> int:
        return int(self.totals.get(phase, {}).get("core.step", [0.0, 0.0])[1])

    def ms_per_step(self, phase: str, component: str) -> float | None:
        """Milliseconds per step of `phase` spent in `component` (None: never called)."""
        steps = self.steps(phase)
        cells = self.totals.get(phase, {})
        if steps == 0:
            return None
        if component == "executor+ipc":
            if "core.step" not in cells:
                return None
            parts = ("core.schedule", "core.update_from_output", "execute_model", "sample_tokens")
            rest = cells["core.step"][0] - sum(cells.get(p, [0.0])[0] for p in parts)
            return 1e3 * rest / steps
        if component not in cells:
            return None
        return 1e3 * cells[component][0] / steps


def timer_table(cases: list[Case], phase: str) -> str:
    """The attribution table of one phase: a row per component, a column per case."""
    width = max(12, *(len(c.name) + 1 for c in cases))
    head = f"{'component (' + phase + ', ms/step)':<34}" + "".join(
        f"{c.name:>{width}}" for c in cases
    )
    lines = [head, f"{'steps':<34}" + "".join(f"{c.steps(phase):>{width}}" for c in cases)]
    for component, _ in ROWS:
        values = [c.ms_per_step(phase, component) for c in cases]
        if all(v is None for v in values):
            continue
        cells = "".join(f"{'-':>{width}}" if v is None else f"{v:>{width}.3f}" for v in values)
        lines.append(f"{component:<34}{cells}")
    return "\n".join(lines)
