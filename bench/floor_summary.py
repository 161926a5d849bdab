"""The statistics and tables of a `bench.floor_interleaved` run: each request paired with
the same request of the no-drafter engine's run of its burst, medians of the ratios with a
bootstrap over whole bursts, per concurrency and per prompt family, and the k = 0 plot."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.stats import bootstrap_interval

BASE = "no drafter"
NULL = "no drafter (again)"

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
                if not per_burst:
                    continue
                low, high = bootstrap_interval(per_burst, median_ratio)
                row[metric] = {
                    "ratio": round(median_ratio(per_burst), 4),
                    "ci95": [round(low, 4), round(high, 4)],
                    "n": sum(len(r) for r in per_burst),
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
                    low, high = bootstrap_interval(per_burst, median_ratio)
                    row[metric] = {
                        "ratio": round(median_ratio(per_burst), 4),
                        "ci95": [round(low, 4), round(high, 4)],
                        "n": sum(len(r) for r in per_burst),
                    }
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
