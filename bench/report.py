"""The benchmark's verdict: `summary.json` from the runs, with the claims checked.

Every claim the gateway makes (adaptive against the best static depth, no class
below its floor, k settling after a phase shift, the gateway's overhead) becomes a
row of the checks table with the measured value, the target and pass/fail; a
claim that cannot be evaluated (a mode or concurrency not in this run) says so
instead of passing. `bench.render` writes `report.md` from the summary.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from bench.runner import RunResult
from bench.stats import (
    class_ratios,
    decode_step_s,
    estimated_speed,
    group_runs,
    median_e2e_by_index,
    median_interval,
    oracle,
    run_tokens_per_s,
    settle_points,
    summarise_cell,
)

ADAPTIVE = "adaptive"
#: Adaptive with every class's `batch-floor` at 0.98 (`bench.modes`).
ADAPTIVE_FLOOR = "adaptive-floor"
NO_SPEC = "no-spec"
#: The speculative engine pinned to k = 0: no-spec's work on another process, so its
#: class ratios to no-spec are what the worst-class check reads with nothing to find.
K0 = "k0"


def build_summary(
    runs: list[RunResult],
    meta: dict[str, Any],
    overhead: dict[str, Any] | None = None,
    cost_models: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    cells: dict[str, dict[str, Any]] = defaultdict(dict)
    for (mode, arrival), group in group_runs(runs).items():
        cells[mode][arrival] = summarise_cell(group)
    arrivals = sorted({r.key.arrival for r in runs})
    summary: dict[str, Any] = {
        "meta": meta,
        "cells": dict(cells),
        "class_ratios": _class_ratios(runs),
        "tokens_per_s_by_repeat": _by_repeat(runs),
        "oracle": {a: _oracle_for(runs, a) for a in arrivals},
        "settle": {a: _settle_for(runs, a) for a in arrivals},
        "overhead": overhead,
        "k_by_phase": {a: _k_by_phase(runs, a) for a in arrivals},
        "step_costs": {a: _step_costs(runs, a) for a in arrivals},
        "cost_models": cost_models or {},
    }
    summary["checks"] = checks(summary)
    summary["yardsticks"] = yardsticks(summary)
    return summary


def _by_repeat(runs: list[RunResult]) -> dict[str, dict[str, dict[str, float]]]:
    """mode -> arrival -> repeat (as text, for JSON) -> tokens/s of that run."""
    out: dict[str, dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for run in runs:
        if run.wall_s > 0:
            out[run.key.mode][run.key.arrival][str(run.key.repeat)] = run_tokens_per_s(run)
    return {m: dict(a) for m, a in out.items()}


def _paired(summary: dict[str, Any], mode: str, other: str, arrival: str) -> list[float]:
    """mode / other tokens/s repeat by repeat: interleaved, repeat r of every mode ran
    within minutes of each other, so the pair shares the host's state of the moment."""
    by = summary.get("tokens_per_s_by_repeat", {})
    a, b = by.get(mode, {}).get(arrival, {}), by.get(other, {}).get(arrival, {})
    return [a[r] / b[r] for r in sorted(a.keys() & b.keys(), key=int) if b[r] > 0]


def _class_ratios(runs: list[RunResult]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per adaptive mode and arrival: each class's speed / its speed without speculation."""
    groups = group_runs(runs)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (mode, arrival), group in sorted(groups.items()):
        base = groups.get((NO_SPEC, arrival))
        if mode in (ADAPTIVE, ADAPTIVE_FLOOR, K0) and base:
            ratios = class_ratios(group, base)
            out.setdefault(mode, {})[arrival] = {c: r.to_json() for c, r in ratios.items()}
    return out


def static_depth(mode: str) -> int | None:
    """k of a static mode on the speculative engine (`k0` and `static-kN`), else None."""
    if mode == "k0":
        return 0
    if mode.startswith("static-k"):
        return int(mode.removeprefix("static-k"))
    return None


def _oracle_for(runs: list[RunResult], arrival: str) -> dict[str, Any]:
    static: dict[int, list[RunResult]] = defaultdict(list)
    by_mode: dict[str, list[RunResult]] = defaultdict(list)
    for r in runs:
        if r.key.arrival != arrival:
            continue
        by_mode[r.key.mode].append(r)
        k = static_depth(r.key.mode)
        if k is not None:
            static[k].append(r)
    if not static:
        return {"choice": {}, "estimated_speed": None, "mode_estimated_speed": {}}
    choice, assembled = oracle(dict(static))
    return {
        "choice": choice,
        "estimated_speed": estimated_speed(assembled),
        "mode_estimated_speed": {
            m: estimated_speed(median_e2e_by_index(rs)) for m, rs in sorted(by_mode.items())
        },
    }


def _step_costs(runs: list[RunResult], arrival: str) -> dict[str, Any]:
    """Measured decode-step time of each static depth (median over its requests, all
    repeats) and its cost relative to k = 0's: what the controller's cost model should
    have learned for this load (`cost_models` holds what it did learn)."""
    steps: dict[int, list[float]] = defaultdict(list)
    for r in runs:
        k = static_depth(r.key.mode)
        if r.key.arrival == arrival and k is not None:
            steps[k] += [s for rec in r.records if (s := decode_step_s(rec)) is not None]
    median_ms = {k: statistics.median(v) * 1000 for k, v in sorted(steps.items()) if v}
    base = median_ms.get(0)
    return {
        "step_ms": {str(k): round(v, 2) for k, v in median_ms.items()},
        "relative": {str(k): round(v / base, 3) for k, v in median_ms.items()} if base else {},
    }


def _settle_for(runs: list[RunResult], arrival: str) -> dict[str, float | None]:
    per_repeat = [
        settle_points(r.records)
        for r in runs
        if r.key.mode == ADAPTIVE and r.key.arrival == arrival
    ]
    keys = sorted({k for p in per_repeat for k in p})
    out: dict[str, float | None] = {}
    for key in keys:
        vals = [v for p in per_repeat if (v := p.get(key)) is not None]
        out[key] = statistics.median(vals) if vals else None
    return out


def _k_by_phase(runs: list[RunResult], arrival: str) -> dict[str, dict[str, list[int]]]:
    """Adaptive: per phase and class, the k of each request in start order (every repeat)."""
    out: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if run.key.mode != ADAPTIVE or run.key.arrival != arrival:
            continue
        for r in sorted(run.records, key=lambda r: r.start):
            if r.k is not None:
                out[f"r{run.key.repeat}/phase{r.phase}"][r.family].append(r.k)
    return {phase: dict(sorted(by_class.items())) for phase, by_class in sorted(out.items())}


def _tps(summary: dict[str, Any], mode: str, arrival: str) -> float | None:
    cell = summary["cells"].get(mode, {}).get(arrival)
    return cell["tokens_per_s"]["median"] if cell else None


def _check(
    name: str, value: float | None, target: str, ok: bool | None, detail: str = ""
) -> dict[str, Any]:
    return {"claim": name, "value": value, "target": target, "pass": ok, "detail": detail}


def checks(summary: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for mode in (ADAPTIVE, ADAPTIVE_FLOOR):
        if mode == ADAPTIVE or mode in summary["cells"]:
            out += _adaptive_checks(summary, mode)
    for arrival, points in summary["settle"].items():
        vals = [v for v in points.values() if v is not None]
        worst_settle = max(vals) if vals else None
        out.append(
            _check(
                f"k settles after a phase shift, worst class ({arrival}, requests)",
                worst_settle,
                "<= 50",
                None if worst_settle is None else worst_settle <= 50,
            )
        )
    return out + _floor_checks(summary) + _overhead_checks(summary.get("overhead"))


def _floor_checks(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """k = 0 on the speculative engine against the engine without a drafter, per arrival:
    the median of the repeat-by-repeat ratios (each pair ran within a minute of each
    other), since the ratio of the two medians pairs runs minutes apart, with the
    median's distribution-free interval (the range below 6 repeats)."""
    out: list[dict[str, Any]] = []
    for arrival in ("c1", "c4", "c16"):
        pairs = _paired(summary, K0, NO_SPEC, arrival)
        if not pairs:
            continue
        value, low, high = median_interval(pairs)
        detail = f"95% CI {low:.2f}-{high:.2f}; by repeat " + ", ".join(f"{v:.2f}" for v in pairs)
        out.append(
            _check(
                f"k0 / no speculation tokens/s, paired by repeat ({arrival})",
                value,
                ">= 0.97",
                value >= 0.97,
                detail,
            )
        )
    return out


def _worst_class(ratios: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """(class, its `class_ratios` entry) with the lowest ratio."""
    return min(ratios.items(), key=lambda item: item[1]["ratio"])


def yardsticks(summary: dict[str, Any]) -> dict[str, Any]:
    """What the checks can read in this run at best and with nothing to find.

    - `oracle_over_best_static`: the hindsight per-class oracle over the best static
      k at c4, both estimated from the same per-request times: the most choosing a
      static k per class and phase could have gained here over one k for all; a
      1.10x target above it asks for more than per-class choice gives.
    - `k0_worst_class`: per arrival, the worst class of `k0` / no speculation; `k0`
      decodes every request without drafting, as no-spec does, so this is the
      worst-class check's reading of two runs of the same work (its noise floor).
    """
    orc = summary["oracle"].get("c4", {})
    speeds = orc.get("mode_estimated_speed", {})
    statics = {m: v for m, v in speeds.items() if static_depth(m) is not None and v}
    best = max(statics, key=lambda m: statics[m], default=None)
    ora = orc.get("estimated_speed")
    headroom = {
        "value": ora / statics[best] if best and ora else None,
        "best_static": best,
    }
    worst: dict[str, Any] = {}
    for arrival, ratios in summary.get("class_ratios", {}).get(K0, {}).items():
        if ratios:
            cls, r = _worst_class(ratios)
            worst[arrival] = {"class": cls, **r}
    return {"oracle_over_best_static": headroom, "k0_worst_class": worst}


def _adaptive_checks(summary: dict[str, Any], mode: str) -> list[dict[str, Any]]:
    """The claims for one adaptive mode: c4 totals, and every class's floor."""
    out: list[dict[str, Any]] = []
    c4 = "c4"
    statics = [m for m in summary["cells"] if static_depth(m) is not None]
    adaptive = _tps(summary, mode, c4)
    speeds = {m: v for m in statics if (v := _tps(summary, m, c4)) is not None}
    best_mode = max(speeds, key=lambda m: speeds[m], default=None)
    best = speeds.get(best_mode) if best_mode else None
    ratio = adaptive / best if adaptive and best else None
    detail = ""
    if best_mode is not None and (pairs := _paired(summary, mode, best_mode, c4)):
        detail = f"{best_mode}; by repeat " + ", ".join(f"{v:.2f}" for v in pairs)
    out.append(
        _check(
            f"{mode} tokens/s / best static k, k0 included (c4)",
            ratio,
            ">= 1.10",
            None if ratio is None else ratio >= 1.10,
            detail,
        )
    )
    orc = summary["oracle"].get(c4, {})
    est = orc.get("mode_estimated_speed", {}).get(mode)
    ora = orc.get("estimated_speed")
    ratio = est / ora if est and ora else None
    out.append(
        _check(
            f"{mode} / hindsight per-class oracle (c4, estimated)",
            ratio,
            ">= 0.95",
            None if ratio is None else ratio >= 0.95,
        )
    )
    for arrival in ("c1", "c4", "c16"):
        # Pooled over repeats, with the paired bootstrap's 90 % interval: a class has
        # 2 to 13 requests a run, and the interval says whether the verdict is the
        # class's or its few requests' luck.
        ratios = summary.get("class_ratios", {}).get(mode, {}).get(arrival, {})
        worst, detail = None, ""
        if ratios:
            cls, r = _worst_class(ratios)
            worst = r["ratio"]
            detail = f"{cls}; 90% CI {r['low']:.2f}-{r['high']:.2f}, {r['pairs']} requests"
        out.append(
            _check(
                f"worst class: {mode} / no speculation ({arrival})",
                worst,
                ">= 0.98",
                None if worst is None else worst >= 0.98,
                detail,
            )
        )
    return out


def _overhead_checks(ovh: dict[str, Any] | None) -> list[dict[str, Any]]:
    ovh = ovh or {}
    rows = [
        ("gateway-added latency p50 (ms, no-op engine)", "added_p50_ms", "<= 1", 1.0, False),
        ("gateway-added latency p99 (ms, no-op engine)", "added_p99_ms", "<= 5", 5.0, False),
        (
            "streaming requests/s per core (no-op engine)",
            "requests_per_s_per_core",
            ">= 300",
            300.0,
            True,
        ),
    ]
    out = []
    for claim, key, target, bound, at_least in rows:
        v = ovh.get(key)
        ok = None if v is None else (v >= bound if at_least else v <= bound)
        out.append(_check(claim, v, target, ok))
    return out
