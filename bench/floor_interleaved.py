"""The speculation floor per request: both engines resident, each burst run on every variant.

    python -m bench.floor_interleaved [--bursts 80 48 32] [--concurrency 1 4 16] [--depths 0 4]

`bench.floor_resident` compares turns of a few seconds, and the host's drift between
two turns (a quarter within minutes on a shared VM) leaves its A/A null at about +-10 %.
Here the unit is one burst of requests, run on every variant back to back with an idle
gap before each: the same prompts, reply lengths and order on the engine without a
drafter (A), on it again (A', the A/A null: the method's own resolution), and on the
speculative engine (EAGLE 3.1, K = --max-depth) at each depth in --depths; the order of
the variants is shuffled per burst (seeded). Each request's figure is set against the
same request of A's run of that burst, a few seconds apart, so drift slower than that
cancels.

A burst at concurrency c: c - 1 requests start together and, once each has its first
token, one more joins the batch they decode in (at c = 1: one request alone). Read per
request: TTFT of the starters (a batch's prefill), TTFT of the joiner (a newcomer that
waits for a decoding batch's step, as under steady traffic), TPOT of all (vLLM's
per-request figures from engine-core timestamps), and the engine's CPU seconds per output
token over the burst (its processes from /proc).

Printed per concurrency and variant: the median over requests of B / A, and its 95 %
interval from a bootstrap that resamples whole bursts (a burst's requests share a batch,
so they are not independent); then the same per prompt family, every concurrency pooled
(long context among them). Targets: k = 0 within 1.03x on TTFT and TPOT, k > 0 TTFT
within 1.2x. Written: the results (--out, raw bursts included) and a PNG of the k = 0 rows;
`--summarise-only FILE` prints the tables again from a results file, `--plot-only FILE...`
redraws the PNG. A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.floor_profile import _one, family_prompts
from bench.floor_resident import (
    BASE,
    NULL,
    cpu_seconds,
    print_now,
    resident_engines,
    turn_order,
    variants,
)
from bench.stats import bootstrap_interval

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


def burst_plans(conc: int, bursts: int, max_tokens: int, seed: int) -> list[Plan]:
    """`bursts` bursts of `conc` requests over the bench's family prompts (long context
    included), reply lengths drawn in [max_tokens / 2, 3 max_tokens / 2] (seeded)."""
    pool = family_prompts(conc * bursts)
    # The pool is finite: past its end prompts repeat (each request's unique first block
    # still keeps it from the prefix cache).
    labelled = [pool[i % len(pool)] for i in range(conc * bursts)]
    rng = random.Random(seed)
    plans = []
    for b in range(bursts):
        chunk = labelled[b * conc : (b + 1) * conc]
        lengths = tuple(rng.randint(max_tokens // 2, 3 * max_tokens // 2) for _ in chunk)
        plans.append(Plan(tuple(t for _, t in chunk), lengths, tuple(f for f, _ in chunk)))
    return plans


async def run_burst(engine: Any, pids: set[int], plan: Plan, k: int) -> BurstRun:
    """The plan's starters together, then its joiner once each starter has a token."""
    starters = len(plan.texts) - 1
    firsts = [asyncio.Event() for _ in range(starters)]
    cpu0 = cpu_seconds(pids)
    tasks = [
        asyncio.create_task(_one(engine, plan.texts[i], k, plan.lengths[i], firsts[i]))
        for i in range(starters)
    ]
    for event in firsts:
        await event.wait()
    joiner = asyncio.create_task(_one(engine, plan.texts[-1], k, plan.lengths[-1]))
    outcomes = await asyncio.gather(*tasks, joiner)
    cpu = cpu_seconds(pids) - cpu0
    tokens = sum(o.output_tokens for o in outcomes)
    run = BurstRun()
    for i, o in enumerate(outcomes):
        joined = i == starters
        run.ttft_start.append(None if joined else o.ttft_s)
        run.ttft_join.append(o.ttft_s if joined else None)
        run.tpot.append(o.tpot_s)
    run.cpu_per_token.append(cpu / max(tokens, 1))
    return run


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
            f"| {r['family']} | {r['variant']} | {_cell(r, 'ttft')} | {_cell(r, 'tpot')} | {n} |"
        )
    return lines


def _median_ms(runs: Sequence[BurstRun], metric: str) -> float:
    values = [v for run in runs for v in getattr(run, metric) if v]
    return round(1e3 * statistics.median(values), 3) if values else math.nan


def _cell(row: dict[str, Any], metric: str) -> str:
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
        cells = " | ".join(_cell(r, m) for m in METRICS)
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

    shown = [r for r in rows if r["variant"] in (NULL, "k = 0")]
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


def _depth(name: str) -> int:
    return 0 if name in (BASE, NULL) else int(name.split("=")[1])


async def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    names = variants(args.depths, args.null)
    bursts = dict(zip(args.concurrency, args.bursts, strict=True))
    runs: dict[tuple[int, str], list[BurstRun]] = {
        (c, n): [] for c in args.concurrency for n in names
    }
    all_plans = {c: burst_plans(c, bursts[c], args.max_tokens, seed=c) for c in args.concurrency}
    async with resident_engines(args, log) as (engines, pids, described):
        started = time.perf_counter()
        for conc in args.concurrency:
            plans = all_plans[conc]
            for b, plan in enumerate(plans):
                for name in turn_order(1000 * conc + b, names):
                    which = BASE if name in (BASE, NULL) else "speculative"
                    # vLLM's workers spin on their queue for a second after their last read
                    # (`shm_broadcast`): let the engine that ran last fall asleep first.
                    await asyncio.sleep(args.gap)
                    burst = await run_burst(engines[which], pids[which], plan, _depth(name))
                    runs[(conc, name)].append(burst)
                if (b + 1) % max(1, len(plans) // 4) == 0 or b + 1 == len(plans):
                    so_far = summarise(
                        {key: v for key, v in runs.items() if key[0] == conc}, [conc], names
                    )
                    brief = "; ".join(f"{r['variant']} TPOT {_cell(r, 'tpot')}" for r in so_far)
                    log(
                        f"c{conc} [{b + 1}/{len(plans)}] "
                        f"{time.perf_counter() - started:.0f} s: {brief}"
                    )
    rows, families = report(runs, all_plans, names, log)
    raw = {
        f"c{c} {n}": [{m: getattr(r, m) for m in METRICS} for r in burst_runs]
        for (c, n), burst_runs in runs.items()
    }
    return {
        "command": " ".join(sys.argv),
        "model": described,
        "rows": rows,
        "families": families,
        "bursts": raw,
    }


def report(
    runs: dict[tuple[int, str], list[BurstRun]],
    plans: dict[int, list[Plan]],
    names: Sequence[str],
    log: Callable[[str], None],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The summary rows and the family rows, both tables logged."""
    rows = summarise(runs, list(plans), names)
    families = by_family(runs, plans, names)
    for line in [*table(rows), "", *family_table(families)]:
        log(line)
    return rows, families


def from_results(
    path: Path,
) -> tuple[dict[tuple[int, str], list[BurstRun]], dict[int, list[Plan]], list[str]]:
    """A results file's burst runs, with the plans its arguments rebuild (the same seeds)."""
    body = json.loads(path.read_text())
    args = body["args"]
    names = variants(args["depths"], args["null"])
    # `main` writes one burst count per concurrency (a single count already expanded).
    plans = {
        c: burst_plans(c, n, args["max_tokens"], seed=c)
        for c, n in zip(args["concurrency"], args["bursts"], strict=True)
    }
    runs = {
        (c, n): [BurstRun(**burst) for burst in body["bursts"][f"c{c} {n}"]]
        for c in plans
        for n in names
    }
    return runs, plans, names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument(
        "--bursts", type=int, nargs="+", default=[80, 48, 32], help="per concurrency"
    )
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--no-null", dest="null", action="store_false", help="skip A'")
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--gap", type=float, default=1.2, help="idle seconds before a burst")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=Path("bench/results/floor_interleaved.json"))
    parser.add_argument("--layers", type=int, default=16, help="tiny target layers (no real model)")
    parser.add_argument("--hidden", type=int, default=256, help="tiny target width (no real model)")
    parser.add_argument(
        "--summarise-only",
        type=Path,
        help="print the tables (prompt families included) from a results file; run nothing",
    )
    parser.add_argument(
        "--plot-only",
        type=Path,
        nargs="+",
        help="draw the PNG (--out with .png) from these results files; run nothing",
    )
    args = parser.parse_args()
    if args.summarise_only:
        report(*from_results(args.summarise_only), print_now)
        return
    if args.plot_only:
        rows = [row for f in args.plot_only for row in json.loads(f.read_text())["rows"]]
        print(f"wrote {plot(rows, args.out.with_suffix('.png'))}")
        return
    if len(args.bursts) == 1:
        args.bursts = args.bursts * len(args.concurrency)
    if len(args.bursts) != len(args.concurrency):
        parser.error("--bursts: one count, or one per --concurrency")
    body = asyncio.run(run(args, print_now))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    body["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    args.out.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {args.out} and {plot(body['rows'], args.out.with_suffix('.png'))}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
