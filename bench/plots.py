"""PNG plots of a benchmark run: throughput by mode, and k / acceptance per class over time.

Time is the request's position in the workload (requests ordered by start), so
phase boundaries are vertical lines at fixed request indices for every mode.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.replay import RequestRecord
from bench.runner import RunResult

ADAPTIVE = "adaptive"


def plot_throughput(summary: dict[str, Any], path: Path) -> Path:
    """Grouped bars: output tokens/s per mode for each arrival, whiskers min..max over repeats."""
    modes = list(summary["cells"])
    arrivals = sorted({a for cells in summary["cells"].values() for a in cells}, key=_arrival_key)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(arrivals) + 4), 4.5))
    width = 0.8 / max(1, len(modes))
    for m, mode in enumerate(modes):
        xs, ys, lo, hi = [], [], [], []
        for a, arrival in enumerate(arrivals):
            cell = summary["cells"][mode].get(arrival)
            if cell is None or cell["tokens_per_s"]["median"] is None:
                continue
            tps = cell["tokens_per_s"]
            xs.append(a + (m - (len(modes) - 1) / 2) * width)
            ys.append(tps["median"])
            lo.append(tps["median"] - tps["min"])
            hi.append(tps["max"] - tps["median"])
        ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=mode)
    ax.set_xticks(range(len(arrivals)), arrivals)
    ax.set_ylabel("output tokens/s")
    ax.set_title("Output tokens/s by mode and arrival (median, min–max)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _arrival_key(label: str) -> tuple[int, float]:
    if label.startswith("c") and label[1:].isdigit():
        return (0, float(label[1:]))
    return (1, float(label.removeprefix("poisson") or 0))


def _pick_run(runs: list[RunResult], mode: str) -> RunResult | None:
    """The last repeat of `mode` at c4 when present, else at the first arrival it ran."""
    cands = [r for r in runs if r.key.mode == mode]
    if not cands:
        return None
    c4 = [r for r in cands if r.key.arrival == "c4"]
    pool = c4 or [r for r in cands if r.key.arrival == cands[0].key.arrival]
    return max(pool, key=lambda r: r.key.repeat)


def _series(
    records: list[RequestRecord], value: str
) -> tuple[dict[str, tuple[list[int], list[float]]], list[int]]:
    ordered = sorted(records, key=lambda r: r.start)
    series: dict[str, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    bounds = [i for i in range(1, len(ordered)) if ordered[i].phase != ordered[i - 1].phase]
    for pos, r in enumerate(ordered):
        v = getattr(r, value)
        if v is None:
            continue
        xs, ys = series[r.family]
        xs.append(pos)
        ys.append(float(v))
    return dict(series), bounds


def _rolling(ys: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def plot_over_time(
    runs: list[RunResult], value: str, path: Path, title: str, window: int = 1, mode: str = ADAPTIVE
) -> Path | None:
    run = _pick_run(runs, mode)
    if run is None:
        return None
    series, bounds = _series(run.records, value)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for i, (family, (xs, ys)) in enumerate(sorted(series.items())):
        smooth = _rolling(ys, window) if window > 1 else ys
        offset = (i - len(series) / 2) * 0.04 if value == "k" else 0.0
        ax.plot(xs, [y + offset for y in smooth], marker=".", lw=1, ms=3, label=family)
    for b in bounds:
        ax.axvline(b, color="grey", ls="--", lw=1)
    ax.set_xlabel("request (in start order); dashed = phase boundary")
    ax.set_ylabel(value)
    ax.set_title(f"{title} — {run.key.mode}, {run.key.arrival}, repeat {run.key.repeat}")
    if series:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(summary: dict[str, Any], runs: list[RunResult], out_dir: Path) -> list[Path]:
    paths = [plot_throughput(summary, out_dir / "tokens_per_s.png")]
    k_plot = plot_over_time(runs, "k", out_dir / "k_over_time.png", "k per class")
    acc_plot = plot_over_time(
        runs,
        "acceptance_length",
        out_dir / "acceptance_over_time.png",
        "acceptance length per class (rolling mean of 10 requests of the class)",
        window=10,
    )
    paths += [p for p in (k_plot, acc_plot) if p is not None]
    return paths
