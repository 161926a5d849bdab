"""One variant of a `bench.floor_interleaved` run against the static depths of the same run.

`--versus LABEL` reads the variant `LABEL` (an engine of `--variant` at the depth it ran)
against two references built from the speculative engine's static runs of the same
bursts, request by request:

- the best static depth: the one depth, of `--depths`, with the lowest median TPOT over
  every request at that concurrency;
- per-class depths: each request at the depth with the lowest median TPOT over the
  requests of its prompt family at that concurrency (a class per family, as the
  gateway's classifier keys them), read from the static run at that depth.

Both choices are cross-fitted: a burst's reference depths are chosen on the bursts of
the other parity, so the noise of picking the fastest of several depths does not flatter
the reference (in-sample, the minimum of noisy medians reads low). At concurrency 1 a
request runs alone, so its run at its family's depth is exactly what a per-class engine
would run; in a batch the static run's batch-mates ran at the same depth, not at their
own families' depths, which the per-class figure there does not model.

The figure is the speed-up `reference TPOT / LABEL TPOT` (above 1: LABEL is faster), the
median over requests with a 95 % interval from a bootstrap over whole bursts, as every
figure of the instrument. With `--compare-outputs` each request's output tokens are kept
as a digest, and each variant's share of requests whose greedy output is token-identical
to the same request at k = 0 is printed too.
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Sequence
from typing import Any

from bench.floor_summary import BurstRun, Plan, paired_ratios, ratio_cell

#: The static run every output is compared with.
REFERENCE = "k = 0"


def digest(tokens: Sequence[int]) -> str:
    """A short fingerprint of a token sequence (equal sequences, equal digests)."""
    return hashlib.blake2b(",".join(map(str, tokens)).encode(), digest_size=8).hexdigest()


def static_depths(names: Sequence[str]) -> dict[str, int]:
    """The speculative engine's static variants: name -> depth (`k = d`)."""
    return {n: int(n[4:]) for n in names if n.startswith("k = ") and n[4:].isdigit()}


def _fastest(runs: dict[str, list[BurstRun]], keep: dict[int, list[bool]]) -> str:
    """Of the static runs, the one with the lowest median TPOT over the kept requests."""

    def median(name: str) -> float:
        values = [
            t
            for b, run in enumerate(runs[name])
            for t, k in zip(run.tpot, keep.get(b, []), strict=False)
            if k and t
        ]
        return statistics.median(values) if values else float("inf")

    return min(runs, key=median)


def chosen(
    statics: dict[str, list[BurstRun]], plans: Sequence[Plan], parity: int
) -> tuple[str, dict[str, str]]:
    """The best static run and each family's, chosen on the bursts of `parity`."""
    picked = [b for b in range(len(plans)) if b % 2 == parity]
    every = {b: [True] * len(plans[b].texts) for b in picked}
    best = _fastest(statics, every)
    families = sorted({f for p in plans for f in p.families})
    per_family = {
        f: _fastest(statics, {b: [x == f for x in plans[b].families] for b in picked})
        for f in families
    }
    return best, per_family


def versus(
    runs: dict[tuple[int, str], list[BurstRun]],
    plans: dict[int, list[Plan]],
    names: Sequence[str],
    label: str,
) -> list[dict[str, Any]]:
    """Per concurrency: `label` against the best static depth and per-class depths
    (module docstring), and the depths chosen on all bursts (for the reader)."""
    rows = []
    depth = static_depths(names)
    for conc, conc_plans in plans.items():
        statics = {n: runs[(conc, n)] for n in depth}
        mine = runs[(conc, label)]
        # A burst's references come from the other parity's choice (cross-fitting).
        choice = {p: chosen(statics, conc_plans, 1 - p) for p in (0, 1)}
        best_bursts, class_bursts = [], []
        for b, plan in enumerate(conc_plans):
            best, per_family = choice[b % 2]
            best_bursts.append(paired_ratios(mine[b].tpot, statics[best][b].tpot))
            reference = [statics[per_family[f]][b].tpot[i] for i, f in enumerate(plan.families)]
            class_bursts.append(paired_ratios(mine[b].tpot, reference))
        every = range(len(conc_plans))
        shown_best = _fastest(statics, {b: [True] * len(conc_plans[b].texts) for b in every})
        families = sorted({f for p in conc_plans for f in p.families})
        shown_family = {
            f: _fastest(statics, {b: [x == f for x in conc_plans[b].families] for b in every})
            for f in families
        }
        rows.append(
            {
                "concurrency": conc,
                "variant": label,
                "vs_best_static": ratio_cell([r for r in best_bursts if r]),
                "vs_per_class": ratio_cell([r for r in class_bursts if r]),
                "best_static": depth[shown_best],
                "class_depths": {f: depth[n] for f, n in shown_family.items()},
            }
        )
    return rows


def identity(
    runs: dict[tuple[int, str], list[BurstRun]], concurrency: Sequence[int], names: Sequence[str]
) -> list[dict[str, Any]]:
    """Per concurrency and variant: requests whose output digest equals the same
    request's at k = 0 on the speculative engine, of those both kept."""
    rows = []
    for conc in concurrency:
        reference = runs.get((conc, REFERENCE), [])
        for name in names:
            if name == REFERENCE:
                continue
            same = total = 0
            for a, b in zip(reference, runs[(conc, name)], strict=True):
                for x, y in zip(a.digests, b.digests, strict=False):
                    if x and y:
                        total += 1
                        same += x == y
            if total:
                rows.append({"concurrency": conc, "variant": name, "identical": same, "of": total})
    return rows


def _cell(f: dict[str, Any]) -> str:
    return f"{f['ratio']:.3f} [{f['ci95'][0]:.3f}-{f['ci95'][1]:.3f}]"


def versus_table(rows: Sequence[dict[str, Any]], same: Sequence[dict[str, Any]]) -> list[str]:
    lines = [
        "speed-up against the static depths of the same bursts: reference TPOT / variant "
        "TPOT, median over requests [95 %, bootstrap over bursts]; depths chosen "
        "cross-fitted on the other half of the bursts (shown: chosen on all)",
        "| c | variant | vs best static depth | vs per-class depths | requests "
        "| best static k | per-class k |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ks = ", ".join(f"{f} {k}" for f, k in r["class_depths"].items())
        lines.append(
            f"| {r['concurrency']} | {r['variant']} | {_cell(r['vs_best_static'])} "
            f"| {_cell(r['vs_per_class'])} | {r['vs_per_class']['n']} | {r['best_static']} "
            f"| {ks} |"
        )
    if same:
        lines += ["", f"greedy outputs token-identical to {REFERENCE} (same request, same burst)"]
        lines += ["| c | variant | identical |", "|---|---|---|"]
        lines += [
            f"| {r['concurrency']} | {r['variant']} | {r['identical']} / {r['of']} |" for r in same
        ]
    return lines
