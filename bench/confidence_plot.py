"""Reliability diagrams of `bench.confidence`: the drafter's probability of its drafted
token against the observed conditional acceptance, per family and per draft position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

#: Positions drawn in the per-position row (deeper ones have few observations).
POSITIONS_DRAWN = 5


def plot_reliability(summary: dict[str, Any], path: Path) -> Path:
    """One column per (drafter, mode); top row one curve per family (positions pooled),
    bottom row one per draft position (families pooled). Marker area ~ bin count."""
    cells = [(d, m) for d, by_mode in summary.items() for m in by_mode]
    fig, axes = plt.subplots(
        2, len(cells), figsize=(4.2 * len(cells), 8.4), squeeze=False, sharex=True, sharey=True
    )
    for c, (drafter, mode) in enumerate(cells):
        by_family = summary[drafter][mode]
        top, bottom = axes[0][c], axes[1][c]
        for family, s in by_family.items():
            if family == "all":
                continue
            cond = s["conditional"]
            _curve(top, cond["reliability"], f"{family} (AUC {_auc(cond['auc'])})")
        for row in by_family["all"]["positions"][:POSITIONS_DRAWN]:
            label = f"position {row['position'] + 1} (n {row['n']}, AUC {_auc(row['auc'])})"
            _curve(bottom, row["reliability"], label)
        top.set_title(f"{drafter}, {mode}: by family", fontsize=9)
        bottom.set_title(f"{drafter}, {mode}: by draft position", fontsize=9)
        for ax in (top, bottom):
            ax.plot([0, 1], [0, 1], color="grey", linestyle="--", linewidth=0.8)
            ax.set_xlim(0, 1)
            ax.set_ylim(0, 1)
            ax.legend(fontsize=6, loc="upper left")
        bottom.set_xlabel("drafter's probability of its drafted token")
    for r in range(2):
        axes[r][0].set_ylabel("observed conditional acceptance")
    fig.suptitle("Draft confidence reliability (python -m bench.confidence)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _curve(ax: Any, bins: list[dict[str, Any]], label: str) -> None:
    xs = [b["predicted"] for b in bins]
    ys = [b["observed"] for b in bins]
    sizes = [max(4.0, min(80.0, b["n"] / 10)) for b in bins]
    (line,) = ax.plot(xs, ys, linewidth=1, label=label)
    ax.scatter(xs, ys, s=sizes, color=line.get_color())


def _auc(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"
