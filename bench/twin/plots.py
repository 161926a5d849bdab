"""The twin's figures (matplotlib, Agg): the headline (every profile's modes against the best
static depth, by arrival); per profile, tokens/s by mode and arrival; the depth each class
chose over the run with the phase and shift boundaries; and each class's acceptance over
the run (the deepest static run, where every request drafts K, so acceptance is comparable
from request to request)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from bench.twin.modes import (
    ADAPTIVE,
    ADAPTIVE_FLOOR,
    ADAPTIVE_STEP,
    ADAPTIVE_STEP_FREE,
    BASELINES,
    NOSPEC,
    ORACLE,
    UPPER_BOUND,
)
from bench.twin.modes.verify import GATEWAY_AV, VLLM_AV
from bench.twin.records import RequestRecord
from bench.twin.requests import (
    Segment,
    segments,
)
from bench.twin.runner import CaseRun

#: Requests per rolling window of a class's curve.
WINDOW = 15
_STYLE: dict[str, dict[str, Any]] = {
    ADAPTIVE: {"color": "tab:red", "linewidth": 2.5},
    ADAPTIVE_FLOOR: {"color": "tab:orange", "linewidth": 2.0},
    ADAPTIVE_STEP: {"color": "tab:pink", "linewidth": 2.5},
    ADAPTIVE_STEP_FREE: {"color": "tab:olive", "linewidth": 2.0},
    ORACLE: {"color": "black", "linestyle": "--"},
    UPPER_BOUND: {"color": "grey", "linestyle": ":"},
    NOSPEC: {"color": "tab:blue", "linewidth": 2.0},
    BASELINES[0]: {"color": "tab:green"},
    BASELINES[1]: {"color": "tab:purple"},
    BASELINES[2]: {"color": "tab:brown"},
}


def _rolling(values: Sequence[float], window: int = WINDOW) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _boundaries(ax: Any, cuts: Sequence[Segment]) -> None:
    for cut in cuts[1:]:
        ax.axvline(cut.start, color="grey", linewidth=0.8, linestyle="--")
    for cut in cuts:
        ax.text(
            cut.start,
            1.0,
            f" {cut.label}",
            transform=ax.get_xaxis_transform(),
            fontsize=7,
            va="top",
            rotation=90,
        )


def tokens_plot(name: str, profile: Mapping[str, Any], path: Path) -> None:
    arrivals = profile["arrivals"]
    labels = list(arrivals)
    fig, ax = plt.subplots(figsize=(9, 5))
    modes = list(next(iter(arrivals.values()))["tokens_per_s"])
    for mode in modes:
        ys = [arrivals[a]["tokens_per_s"][mode]["median"] for a in labels]
        style = _STYLE.get(mode, {"color": "lightgrey", "linewidth": 1.0})
        ax.plot(labels, ys, marker="o", label=mode, **style)
    ax.set_yscale("log")
    ax.set_ylabel("output tokens/s (virtual time)")
    ax.set_title(f"{name}: tokens/s by mode and arrival (simulation)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _class_series(
    records: Sequence[RequestRecord], value: Any
) -> dict[int, tuple[list[int], list[float]]]:
    series: dict[int, tuple[list[int], list[float]]] = defaultdict(lambda: ([], []))
    for r in sorted(records, key=lambda r: r.index):
        y = value(r)
        if y is not None:
            xs, ys = series[r.class_index]
            xs.append(r.index)
            ys.append(y)
    return series


def k_plot(run: CaseRun, path: Path) -> None:
    """The depth each class chose (rolling mean), per arrival, with the boundaries."""
    names = sorted(run.case.workload.classes)
    cuts = segments(run.case.workload)
    labels = [a for a in run.records if ADAPTIVE in run.records[a]]
    fig, axes = plt.subplots(len(labels), 1, figsize=(10, 2.4 * len(labels)), sharex=True)
    axes = axes if len(labels) > 1 else [axes]
    for ax, label in zip(axes, labels, strict=True):
        series = _class_series(run.records[label][ADAPTIVE], lambda r: float(r.chosen))
        for cls, (xs, ys) in sorted(series.items()):
            ax.plot(xs, _rolling(ys), label=names[cls], linewidth=1.2)
        _boundaries(ax, cuts)
        ax.set_ylabel(f"{label}: k")
    axes[0].set_title(f"{run.case.profile.name}: adaptive's k per class (rolling mean of {WINDOW})")
    axes[0].legend(fontsize=7, ncol=4, loc="lower left")
    axes[-1].set_xlabel("request index")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def acceptance_plot(run: CaseRun, path: Path) -> None:
    """Each class's acceptance rate per request in the deepest static run (first arrival)."""
    names = sorted(run.case.workload.classes)
    cuts = segments(run.case.workload)
    deepest = f"static-k{run.case.profile.max_k}"
    label = next(a for a in run.records if deepest in run.records[a])
    series = _class_series(
        run.records[label][deepest],
        lambda r: r.accepted_tokens / r.draft_tokens if r.draft_tokens else None,
    )
    fig, ax = plt.subplots(figsize=(10, 4))
    for cls, (xs, ys) in sorted(series.items()):
        ax.plot(xs, _rolling(ys), label=names[cls], linewidth=1.2)
    _boundaries(ax, cuts)
    ax.set_ylim(0, 1)
    ax.set_ylabel("accepted / drafted")
    ax.set_xlabel("request index")
    ax.set_title(
        f"{run.case.profile.name}: acceptance per class at k = {run.case.profile.max_k} "
        f"({label}, rolling mean of {WINDOW})"
    )
    ax.legend(fontsize=7, ncol=4, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: The headline's lines: (mode, legend), each read as its `<mode>/best-static` ratio.
HEADLINE = (
    (GATEWAY_AV, "gateway steering adaptive verification (gateway-av)"),
    (VLLM_AV, "vLLM 0.33 adaptive verification (vllm-av)"),
    (ADAPTIVE, "gateway, one depth per request (adaptive)"),
    (NOSPEC, "no speculation"),
    (UPPER_BOUND, "clairvoyant one-depth-per-step bound"),
)
_HEADLINE_STYLE: dict[str, dict[str, Any]] = {
    GATEWAY_AV: {"color": "tab:red", "linewidth": 2.5},
    VLLM_AV: {"color": "tab:green", "linewidth": 2.0},
    ADAPTIVE: {"color": "tab:orange", "linewidth": 1.5},
    NOSPEC: {"color": "tab:blue", "linewidth": 1.5},
    UPPER_BOUND: {"color": "grey", "linestyle": ":"},
}


def _arrival_order(label: str) -> tuple[int, int, str]:
    """Closed loops by concurrency (`c1`, `c4`, ...), then the open-loop arrivals."""
    closed = label[:1] == "c" and label[1:].isdigit()
    return (0, int(label[1:]), "") if closed else (1, 0, label)


def headline_plot(summary: Mapping[str, Any], path: Path) -> None:
    """One panel per profile: each mode's tokens/s over the best static depth's (median over
    seeds), by arrival; a mode a profile did not run is left out of its panel."""
    profiles = summary["profiles"]
    cols = 3
    rows = -(-len(profiles) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (name, profile) in zip(axes.flat, profiles.items(), strict=False):
        labels = sorted(profile["arrivals"], key=_arrival_order)
        for mode, legend in HEADLINE:
            ys = [profile["arrivals"][a]["ratios"].get(f"{mode}/best-static") for a in labels]
            if all(y is None for y in ys):
                continue
            values = [float("nan") if y is None else y["median"] for y in ys]
            ax.plot(labels, values, marker="o", label=legend, **_HEADLINE_STYLE[mode])
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_title(name, fontsize=10)
        ax.tick_params(labelsize=8)
    for ax in list(axes.flat)[len(profiles) :]:
        ax.axis("off")
    axes[0][0].set_ylabel("tokens/s / best static depth's")
    seen: dict[str, Any] = {}
    for ax in axes.flat:
        for handle, legend in zip(*ax.get_legend_handles_labels(), strict=True):
            seen.setdefault(legend, handle)
    fig.legend(list(seen.values()), list(seen), loc="lower center", ncol=3, fontsize=9)
    fig.suptitle("The engine twin (a simulation): each mode against the best static depth")
    fig.tight_layout(rect=(0, 0.08, 1, 0.96))
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_plots(summary: Mapping[str, Any], runs: Sequence[CaseRun], out: Path) -> list[Path]:
    headline = out / "headline.png"
    headline_plot(summary, headline)
    paths = [headline]
    for run in runs:
        name = run.case.profile.name
        tokens, ks, acceptance = (
            out / f"{stem}_{name}.png"
            for stem in ("tokens_per_s", "k_over_time", "acceptance_over_time")
        )
        tokens_plot(name, summary["profiles"][name], tokens)
        k_plot(run, ks)
        acceptance_plot(run, acceptance)
        paths += [tokens, ks, acceptance]
    return paths
