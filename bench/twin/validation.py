"""The twin against the real engine: the `make bench` workload on the `cpu-embedded` profile.

`measurements/make-bench-cpu-embedded.json` is the real-engine run of `python -m bench run`
(the embedded model on this repository's CPU) that the profile's step costs and the
workload's acceptance were derived from, cut to its tokens/s: a later run, on a host
running at another speed, would compare the twin with economics it was not given. For every
arrival and mode both have, the twin's tokens/s relative to no speculation is set beside the real
run's (`cells[mode][arrival].tokens_per_s.median`), with the difference as a share
of the real figure, flagged beyond `TOLERANCE`; per arrival, Kendall's tau
between the two orderings of the modes and whether both put the same mode first.
The real run's `batch-schedule` is its fixed table (`bench.modes.BATCH_SCHEDULE`),
so the twin runs that same table beside its own profiler-derived `vllm-schedule`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: Twin mode -> the real benchmark's name for it (`bench.modes`).
REAL_NAMES = {
    "nospec": "no-spec",
    "static-k0": "k0",
    "batch-schedule": "batch-schedule",
    "adaptive": "adaptive",
    "adaptive-floor": "adaptive-floor",
    **{f"static-k{k}": f"static-k{k}" for k in range(1, 17)},
}
TOLERANCE = 0.15
PROFILE = "cpu-embedded"
#: What the cut of a real run keeps of its `meta` (the run's identity and size).
RUN_META = (
    "families_source",
    "loadavg_start",
    "machine",
    "max_tokens",
    "model_source",
    "phases",
    "repeats",
    "requests_per_run",
    "seed",
    "started",
)


def kendall_tau(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Kendall's tau-a of two scorings of the same items (ties count as neither)."""
    keys = sorted(set(a) & set(b))
    pairs = list(itertools.combinations(keys, 2))
    if not pairs:
        return 0.0
    score = 0
    for x, y in pairs:
        da, db = a[x] - a[y], b[x] - b[y]
        score += (da * db > 0) - (da * db < 0)
    return score / len(pairs)


def compare(twin: Mapping[str, Any], real: Mapping[str, Any]) -> dict[str, Any]:
    """`twin`: a profile's entry of the twin's summary; `real`: the real summary."""
    rows: list[dict[str, Any]] = []
    ranking: dict[str, Any] = {}
    cells = real["cells"]
    for label, cell in twin["arrivals"].items():
        tps = {m: s["median"] for m, s in cell["tokens_per_s"].items()}
        real_tps = {
            m: cells[r][label]["tokens_per_s"]["median"]
            for m, r in REAL_NAMES.items()
            if r in cells and label in cells[r] and m in tps
        }
        if "nospec" not in real_tps:
            continue
        twin_rel = {m: tps[m] / tps["nospec"] for m in real_tps}
        real_rel = {m: v / real_tps["nospec"] for m, v in real_tps.items()}
        for mode in real_tps:
            if mode == "nospec":
                continue
            rows.append(
                {
                    "arrival": label,
                    "mode": mode,
                    "real": real_rel[mode],
                    "twin": twin_rel[mode],
                    "difference": twin_rel[mode] / real_rel[mode] - 1.0,
                }
            )
        ranking[label] = {
            "kendall_tau": kendall_tau(twin_rel, real_rel),
            "real_best": max(sorted(real_rel), key=lambda m: real_rel[m]),
            "twin_best": max(sorted(twin_rel), key=lambda m: twin_rel[m]),
        }
    return {
        "what": (
            f"The `{twin['workload']}` workload on the `{PROFILE}` profile (twin, median over "
            "seeds) beside the real-engine run its profile and workload come from "
            "(`bench/twin/measurements/make-bench-cpu-embedded.json`, median over its "
            "repeats); tokens/s relative to no speculation in each."
        ),
        "tolerance": TOLERANCE,
        "rows": rows,
        "ranking": ranking,
    }


def real_run_cut(summary: Mapping[str, Any], summary_name: str, command: str) -> dict[str, Any]:
    """A `make bench` summary cut to what `compare` reads (each mode and arrival's median
    tokens/s) with the run's identity, as `measurements/make-bench-cpu-embedded.json` keeps it."""
    meta = summary["meta"]
    cells = {
        mode: {
            arrival: {"tokens_per_s": {"median": cell["tokens_per_s"]["median"]}}
            for arrival, cell in arrivals.items()
        }
        for mode, arrivals in summary["cells"].items()
    }
    return {
        "cells": cells,
        "meta": {k: meta[k] for k in RUN_META if k in meta},
        "source": (
            f"The `make bench` run (started {meta['started']}, {summary_name}) the cpu-embedded "
            "profile was derived from, cut to what the validation reads (each mode and arrival: "
            f"tokens/s, median over its repeats), by `{command}`."
        ),
    }


def validate(summary_profiles: Mapping[str, Any], real_path: Path) -> dict[str, Any] | None:
    """The comparison, if the run has the `cpu-embedded` profile and the real summary exists."""
    if PROFILE not in summary_profiles or not real_path.exists():
        return None
    return compare(summary_profiles[PROFILE], json.loads(real_path.read_text()))


#: The twin's gateway-steered verify budget on `cpu-embedded`, against the real engine's
#: confidence budget (`bench.floor_interleaved --versus`), at these concurrencies.
BUDGET_MODE = "gateway-av"
BUDGET_ARRIVALS = ("c1", "c4", "c16")
#: Where the real engine's budget figures are looked for: a `bench.floor_interleaved`
#: results file whose `versus` rows name a variant with this in its label.
BUDGET_RESULTS = "floor_*.json"
BUDGET_LABEL = "budget"


def real_verify_rows(results: Path) -> tuple[str, dict[int, dict[str, Any]]] | None:
    """(file name, concurrency -> its `versus` row) of the first `BUDGET_RESULTS` file in
    `results` with a budget variant's rows; None where none has been measured."""
    for path in sorted(results.glob(BUDGET_RESULTS)):
        if path.name.endswith(".partial.json"):  # a run still under way
            continue
        try:
            rows = json.loads(path.read_text()).get("versus") or []
        except (OSError, ValueError):
            continue
        found = {
            int(r["concurrency"]): r for r in rows if BUDGET_LABEL in str(r.get("variant", ""))
        }
        if found:
            return path.name, found
    return None


def _first_seed_ratio(cell: Mapping[str, Any], mode: str, other: str) -> float | None:
    """`mode`'s tokens/s over `other`'s in the first seed that ran both (the verify modes
    run the first seed only)."""
    for figures in cell["seeds"].values():
        if mode in figures and other in figures:
            return float(figures[mode]["tokens_per_s"] / figures[other]["tokens_per_s"])
    return None


def compare_verify(twin: Mapping[str, Any], results: Path) -> dict[str, Any]:
    """The twin's `gateway-av` over the best static depth and over the per-class hindsight
    depths (`oracle`) on `cpu-embedded`, beside the real engine's confidence budget over
    the best static depth and per-class depths of the same bursts, where measured."""
    real = real_verify_rows(results)
    rows: list[dict[str, Any]] = []
    for label in BUDGET_ARRIVALS:
        cell = twin["arrivals"].get(label)
        if cell is None:
            continue
        best = next(iter(cell["best_static"].values()), None)
        row: dict[str, Any] = {
            "arrival": label,
            "twin_vs_best_static": None
            if best is None
            else _first_seed_ratio(cell, BUDGET_MODE, best),
            "twin_vs_per_class": _first_seed_ratio(cell, BUDGET_MODE, "oracle"),
            "real_vs_best_static": None,
            "real_vs_per_class": None,
        }
        if real is not None and int(label[1:]) in real[1]:
            measured = real[1][int(label[1:])]
            row["real_vs_best_static"] = measured.get("vs_best_static")
            row["real_vs_per_class"] = measured.get("vs_per_class")
        rows.append(row)
    source = (
        f"bench/results/{real[0]}"
        if real is not None
        else f"not measured yet: no bench/results/{BUDGET_RESULTS} with a `{BUDGET_LABEL}` "
        "variant's `versus` rows (`python -m bench.floor_interleaved --variant "
        "'budget=...' --versus budget`)"
    )
    return {
        "what": (
            f"`{BUDGET_MODE}` on `{PROFILE}` (the twin's tokens/s, first seed) over the best "
            "static depth and over each class at its hindsight-best depth (`oracle`), beside "
            "the real CPU engine's confidence budget over the best static depth and per-class "
            "depths of the same bursts (per-request TPOT speed-up, median and 95 % interval)."
        ),
        "source": source,
        "rows": rows,
    }


def validate_verify(summary_profiles: Mapping[str, Any], results: Path) -> dict[str, Any] | None:
    """`compare_verify` where the run has the `cpu-embedded` profile."""
    if PROFILE not in summary_profiles:
        return None
    return compare_verify(summary_profiles[PROFILE], results)
