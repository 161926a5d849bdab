"""`summary.json` of a twin run: every mode's figures, the ratios the claims read, the checks.

Per (profile, arrival) and seed: each mode's figures (`bench.twin.metrics`), and
the ratios: adaptive (and each per-step mode, `STEP_MODES`) over the best static
depth in hindsight (the speculative engine at each `static-k`, k = 0 included, as
the real-engine benchmark reads it; no speculation, another engine, is its own
ratio), over the per-class oracle and over each engine baseline (a per-step mode
also over adaptive); the oracle's and the clairvoyant bound's ceilings over the
best static depth; each mode's worst class against no speculation. A ratio's
spread over seeds is its min / median / max. The checks are the claims of the
twin's definition of done, on the closed-loop arrivals, read at the median over
seeds, for adaptive and for the guarded per-step mode (`CLAIMED`). Floats are
rounded to 6 significant digits and keys sorted, so one seed's inputs give the
same file byte for byte.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.twin.metrics import NEAR_SHARE
from bench.twin.modes import (
    ADAPTIVE,
    ADAPTIVE_FLOOR,
    ADAPTIVE_STEP,
    ADAPTIVE_STEP_FREE,
    BASELINES,
    NOSPEC,
    ORACLE,
    UPPER_BOUND,
    VERIFY_MODES,
    static_modes,
)
from bench.twin.modes.oracle import static_depth
from bench.twin.runner import CaseRun
from bench.twin.verify_summary import (
    default_mode,
    published_rows,
    verify_checks,
    verify_ratios,
)

#: Concurrencies the claims are checked at.
CHECKED = ("c1", "c4", "c16", "c64")
#: adaptive / oracle at least this.
ORACLE_SHARE = 0.97
#: No class below this share of its speed without speculation.
CLASS_FLOOR = 0.99
#: Requests of a class for its depth to settle after a phase shift.
SETTLE_REQUESTS = 20
NEAR_PERCENT = round(100 * NEAR_SHARE)
#: Said of a settling figure whose class's requests ran no draft where it was off its best
#: (held at k = 0 by their batch, or its choice was 0): nothing there moved its estimate.
UNDRAFTED = "its requests ran no draft"
#: Said of a failing worst-class figure where no mode of the run reaches both it and the best
#: static depth (`both_met`): the two targets conflict in that cell for every policy there.
CONFLICT_NONE = (
    "no mode here reaches both this and the best static depth, the clairvoyant bound included"
)
#: The same where only the clairvoyant bound, which knows every step's draws, reaches both.
CONFLICT_BOUND = "only the clairvoyant bound reaches both this and the best static depth here"
#: The same where only yardsticks that know the run in hindsight reach both.
CONFLICT_HINDSIGHT = (
    "only the hindsight oracle and bound reach both this and the best static depth here"
)
#: Where the oracle's ceiling over the best static depth exceeds this, adaptive must reach it.
LARGE_CEILING = 1.10
#: The per-step depth modes (`bench.twin.modes.adaptive_step`); the claims are checked for
#: `adaptive` and for the guarded one.
STEP_MODES = (ADAPTIVE_STEP, ADAPTIVE_STEP_FREE)
CLAIMED = (ADAPTIVE, ADAPTIVE_STEP)


def rounded(value: Any) -> Any:
    """Floats to 6 significant digits, recursively (dict keys as strings)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, Mapping):
        return {str(k): rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [rounded(v) for v in value]
    return value


def spread(values: Sequence[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def best_static(modes: Mapping[str, Mapping[str, Any]], max_k: int) -> str:
    """The static depth with the most tokens/s (ties to the shallower)."""
    present = [m for m in static_modes(max_k) if m in modes and m != NOSPEC]
    return max(present, key=lambda m: (modes[m]["tokens_per_s"], -present.index(m)))


def worst_class(modes: Mapping[str, Mapping[str, Any]], mode: str) -> tuple[str, float]:
    """(class, speed ratio) of the mode's slowest class against no speculation."""
    base = modes[NOSPEC]["class_speed"]
    ratios = {c: s / base[c] for c, s in modes[mode]["class_speed"].items() if base.get(c)}
    cls = min(sorted(ratios), key=lambda c: ratios[c])
    return cls, ratios[cls]


def seed_ratios(modes: Mapping[str, Mapping[str, Any]], max_k: int) -> dict[str, float]:
    """The ratios of one seed's run (module docstring); absent modes are skipped."""
    tps = {m: f["tokens_per_s"] for m, f in modes.items()}
    best = tps[best_static(modes, max_k)]
    out: dict[str, float] = {}
    every = (ADAPTIVE, ADAPTIVE_FLOOR, *STEP_MODES, *VERIFY_MODES, ORACLE, UPPER_BOUND, *BASELINES)
    for mode in (*every, *static_modes(max_k)):
        if mode in tps:
            out[f"{mode}/best-static"] = tps[mode] / best
    for mode in (ADAPTIVE, *STEP_MODES):
        if mode not in tps:
            continue
        for other in (ORACLE, NOSPEC, *BASELINES, *((ADAPTIVE,) if mode != ADAPTIVE else ())):
            if other in tps:
                out[f"{mode}/{other}"] = tps[mode] / tps[other]
    for mode in tps:
        if mode != NOSPEC and NOSPEC in tps:
            out[f"worst-class:{mode}"] = worst_class(modes, mode)[1]
    out.update(verify_ratios(tps, best, max_k))
    return out


def _arrival(run: CaseRun, label: str) -> dict[str, Any]:
    k_max = run.case.profile.max_k
    by_seed = run.cells[label]
    ratios = {seed: seed_ratios(modes, k_max) for seed, modes in by_seed.items()}
    names = sorted({n for r in ratios.values() for n in r})
    modes = sorted({m for seeds in by_seed.values() for m in seeds})
    return {
        "seeds": by_seed,
        "tokens_per_s": {
            m: spread([s[m]["tokens_per_s"] for s in by_seed.values() if m in s]) for m in modes
        },
        "ratios": {n: spread([r[n] for r in ratios.values() if n in r]) for n in names},
        "best_static": {seed: best_static(m, k_max) for seed, m in by_seed.items()},
        "worst_class": {
            seed: {m: worst_class(s, m)[0] for m in s if m != NOSPEC}
            for seed, s in by_seed.items()
            if NOSPEC in s
        },
        "settle": run.settle.get(label, {}),
        "near_settle": run.near_settle.get(label, {}),
        "notes": run.notes.get(label, {}),
        "oracle_choice": run.oracle_choice.get(label, {}),
    }


def worst_settle(
    settle: Mapping[str, Mapping[str, Any]], mode: str
) -> tuple[str, int, bool] | None:
    """The slowest (stretch/class, requests, undrafted) to settle after a phase start or
    shift, over seeds; the run's first stretch (a cold start, not a shift) is left out.
    `undrafted`: that class's requests off its best there ran no draft
    (`bench.twin.metrics.settle_points`)."""
    worst: tuple[str, int, bool] | None = None
    for stretches in settle.values():
        for stretch in stretches.get(mode, []):
            if stretch["start"] == 0:
                continue
            idle = stretch.get("undrafted", ())
            for cls, n in stretch["classes"].items():
                if worst is None or n > worst[1]:
                    worst = (f"{stretch['stretch']}/{cls}", n, cls in idle)
    return worst


def target_figures(
    ratios: Mapping[str, Mapping[str, float]], mode: str
) -> tuple[float | None, float | None]:
    """A mode's two target figures in a cell, at the median over seeds: its tokens/s over
    the best static depth's, and its worst class's speed over that class's with no
    speculation (no speculation's own is 1 by definition); None where the cell lacks one."""
    best = ratios.get(f"{mode}/best-static", {}).get("median")
    worst = 1.0 if mode == NOSPEC else ratios.get(f"worst-class:{mode}", {}).get("median")
    return best, worst


def both_met(best: float | None, worst: float | None) -> bool:
    """Whether a mode's `target_figures` reach both targets: at least the best static
    depth, and its worst class at least `CLASS_FLOOR`."""
    return best is not None and worst is not None and best >= 1.0 and worst >= CLASS_FLOOR


def trade_off_modes(ratio_names: Iterable[str]) -> list[str]:
    """The modes of a cell with a ratio to the best static depth, in the report's order:
    no speculation and the static depths, the engines' baselines, the gateway's modes, the
    yardsticks."""
    ran = {n.removesuffix("/best-static") for n in ratio_names if n.endswith("/best-static")}
    depths = {m: d for m in ran - {NOSPEC} if (d := static_depth(m)) is not None}
    statics = sorted(depths, key=depths.__getitem__)
    order = (NOSPEC, *statics, *BASELINES, ADAPTIVE, ADAPTIVE_FLOOR, *STEP_MODES)
    return [m for m in (*order, ORACLE, UPPER_BOUND) if m in ran]


def class_floor_conflict(ratios: Mapping[str, Mapping[str, float]]) -> str | None:
    """Where no mode of the cell (`trade_off_modes`) but the hindsight yardsticks reaches
    both targets (`both_met`), what the report says of a failing worst-class claim."""
    met = {m for m in trade_off_modes(ratios) if both_met(*target_figures(ratios, m))}
    if not met:
        return CONFLICT_NONE
    if met == {UPPER_BOUND}:
        return CONFLICT_BOUND
    if met <= {ORACLE, UPPER_BOUND}:
        return CONFLICT_HINDSIGHT
    return None


def _check(claim: str, value: float | None, target: str, ok: bool | None) -> dict[str, Any]:
    return {"claim": claim, "value": value, "target": target, "pass": ok}


def checks(arrivals: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The claims on each checked concurrency present, at the median over seeds (settling:
    the slowest seed), for each mode of `CLAIMED` that ran (`adaptive`'s claims first,
    named as before)."""
    out: list[dict[str, Any]] = []
    for mode in CLAIMED:
        for label in CHECKED:
            cell = arrivals.get(label)
            if cell is not None:
                out += _mode_checks(label, cell, mode)
    return out


def _mode_checks(label: str, cell: Mapping[str, Any], mode: str) -> list[dict[str, Any]]:
    r = {n: s["median"] for n, s in cell["ratios"].items()}
    if f"{mode}/best-static" not in r:
        return []
    out: list[dict[str, Any]] = []
    best = r[f"{mode}/best-static"]
    out.append(_check(f"{label}: {mode} / best static", best, ">= 1.00", best >= 1.0))
    if f"{mode}/{ORACLE}" in r:
        v = r[f"{mode}/{ORACLE}"]
        out.append(_check(f"{label}: {mode} / oracle", v, f">= {ORACLE_SHARE}", v >= ORACLE_SHARE))
    for base in BASELINES:
        if f"{mode}/{base}" in r:
            v = r[f"{mode}/{base}"]
            out.append(_check(f"{label}: {mode} / {base}", v, "> 1.00", v > 1.0))
    if f"worst-class:{mode}" in r:
        v = r[f"worst-class:{mode}"]
        claim = "worst class / no spec" if mode == ADAPTIVE else f"{mode}: worst class / no spec"
        conflict = class_floor_conflict(cell["ratios"]) if v < CLASS_FLOOR else None
        if conflict is not None:
            claim = f"{claim} ({conflict})"
        out.append(_check(f"{label}: {claim}", v, f">= {CLASS_FLOOR}", v >= CLASS_FLOOR))
    what = "k" if mode == ADAPTIVE else f"{mode}: its class's vote"
    for key, how in (("settle", "settles"), ("near_settle", f"near-best ({NEAR_PERCENT} %)")):
        settled = worst_settle(cell.get(key, {}), mode)
        if settled is not None:
            where = f"{settled[0]}; {UNDRAFTED}" if settled[2] else settled[0]
            out.append(
                _check(
                    f"{label}: {what} {how} after a shift ({where})",
                    settled[1],
                    f"<= {SETTLE_REQUESTS} requests",
                    settled[1] <= SETTLE_REQUESTS,
                )
            )
    ceiling = r.get(f"{ORACLE}/best-static")
    if ceiling is not None and ceiling > LARGE_CEILING:
        out.append(
            _check(
                f"{label}: oracle ceiling {ceiling:.3f} > {LARGE_CEILING}: {mode} / best static",
                best,
                f">= {LARGE_CEILING}",
                best >= LARGE_CEILING,
            )
        )
    return out


def build_summary(
    runs: Sequence[CaseRun], seeds: Sequence[int], validation: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    profiles: dict[str, Any] = {}
    for run in runs:
        profile, workload = run.case.profile, run.case.workload
        arrivals = {
            a.label: _arrival(run, a.label) for a in workload.arrivals if a.label in run.cells
        }
        profiles[profile.name] = {
            "workload": workload.name,
            "max_k": profile.max_k,
            "requests_per_run": workload.total_requests,
            "profile_source": profile.source,
            "workload_source": workload.source,
            "arrivals": arrivals,
            "checks": checks(arrivals),
            "verify_checks": verify_checks(
                profile.name,
                workload.name,
                arrivals,
                default_mode(profile.batch_depth == "uniform"),
            ),
            "capacity_per_s": run.capacity_per_s,
            "confidence": {
                "scale": run.case.confidence_scale,
                "auc": {c: workload.confidence_auc(c) for c in sorted(workload.classes)},
                "source": workload.confidence.source,
            },
        }
    summary: dict[str, Any] = {
        "meta": {
            "what": "simulation: the engine twin (virtual time, step costs from the profiles) "
            "driving the gateway's real control plane",
            "seeds": list(seeds),
            "max_running": max((r.case.max_running for r in runs), default=256),
            "step_noise": max((r.case.step_noise for r in runs), default=0.0),
        },
        "profiles": profiles,
        "published": published_rows(profiles),
    }
    drift = max((r.case.host_drift for r in runs), default=0.0)
    if drift:
        summary["meta"]["host_drift"] = drift
    if validation is not None:
        summary["validation"] = validation
    return dict(rounded(summary))
