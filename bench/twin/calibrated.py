"""A gateway's start-up calibration (`/admin/costs`) as step costs, and a bench profile
carried past its largest batch by it (`build_profile --bench-summary ... --beyond FILE`).

A `make bench` run measures the CPU engine at its closed loops' concurrencies (1 / 4 / 16),
so a profile built from it stops at batch 16; the twin would otherwise extrapolate further
from the last two batch sizes (`schema._linear`). A calibration of the same engine at that
batch and larger ones gives, per depth, how much a step grows from it: the profile's batch-N
row times that growth. The growth is a ratio of two step-clock medians taken in one
calibration (its depths interleaved, `gateway.calibration`), so the host's speed cancels;
with several calibrations each ratio is their median.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any


def median_by(points: Sequence[Mapping[str, Any]], field: str) -> dict[int, dict[int, float]]:
    """batch -> k -> median of `field` over calibration points (one per batch and k)."""
    values: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        if float(p.get(field, 0.0)) > 0:
            values[int(p["batch"])][int(p["k"])].append(float(p[field]))
    return {
        b: {k: round(statistics.median(v), 3) for k, v in sorted(row.items())}
        for b, row in sorted(values.items())
    }


def growth(
    calibrations: Sequence[tuple[str, Mapping[str, Any]]], base: int, max_k: int
) -> dict[int, dict[int, list[float]]]:
    """batch -> k -> the step's time over its time at batch `base`, one ratio per
    calibration, for every batch above `base` that each calibration timed at 0..max_k."""
    if not calibrations:
        raise ValueError("no calibration given")
    ratios: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    larger: set[int] | None = None
    for name, body in calibrations:
        stats = median_by(list(body.get("calibration") or []), "step_ms")
        missing = [k for k in range(max_k + 1) if k not in stats.get(base, {})]
        if missing:
            raise ValueError(f"{name}: no calibration at batch {base}, k = {missing}")
        above = {
            b for b, row in stats.items() if b > base and all(k in row for k in range(max_k + 1))
        }
        if not above:
            raise ValueError(f"{name}: no batch above {base} calibrated at every k in 0..{max_k}")
        larger = above if larger is None else larger & above
        for b in above:
            for k in range(max_k + 1):
                ratios[b][k].append(stats[b][k] / stats[base][k])
    assert larger is not None
    if not larger:
        raise ValueError(f"the calibrations share no batch above {base}")
    return {b: dict(ratios[b]) for b in sorted(larger)}


def beyond_largest(
    data: dict[str, Any], calibrations: Sequence[tuple[str, Mapping[str, Any]]]
) -> dict[str, Any]:
    """`data` (`from_bench_summary`'s) with its batch sizes above the largest, N, from the
    calibrations: batch_stats[b][k] = batch_stats[N][k] x the median growth of depth k from
    N to b, no_spec_step_ms[b] likewise at k = 0's growth (at most batch_stats[b][0])."""
    stats: dict[int, dict[int, float]] = data["batch_stats"]
    base = max(stats)
    max_k = int(data["max_k"])
    grown = growth(calibrations, base, max_k)
    no_spec: dict[int, float] = data["no_spec_step_ms"]
    out = dict(data)
    out["batch_stats"] = dict(stats)
    out["no_spec_step_ms"] = dict(no_spec)
    for b, by_k in grown.items():
        row = {k: round(stats[base][k] * statistics.median(r), 2) for k, r in by_k.items()}
        out["batch_stats"][b] = row
        zero = no_spec[base] * statistics.median(by_k[0])
        out["no_spec_step_ms"][b] = round(min(zero, row[0]), 2)
    sizes = " / ".join(map(str, grown))
    names = ", ".join(name for name, _ in calibrations)
    out["source"] = (
        f"{data['source']} Batch {sizes}: batch {base}'s figures times each depth's growth from "
        f"batch {base} in {len(calibrations)} start-up calibrations of the same engine (its step "
        f"clock; {names}; the rule: bench.twin.calibrated.beyond_largest)."
    )
    spread = "; ".join(
        f"batch {b}: "
        + ", ".join(
            f"k{k} {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})" for k, r in by_k.items()
        )
        for b, by_k in grown.items()
    )
    out["notes"] = (
        f"{data.get('notes', '')} Growth of each depth's step from batch {base} (median, "
        f"min-max over the calibrations): {spread}."
    ).strip()
    return out
