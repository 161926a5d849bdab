"""The speculation floor at fine resolution: both engines resident, short turns interleaved.

    python -m bench.floor_resident [--alternations 20] [--concurrency 1 4 16] [--depths 0 4]

`bench.floor_parity` starts an engine per turn, so a turn lasts minutes and the host's
drift (up to a quarter within minutes on a shared VM) lands between the two engines'
turns. Here the engine without a drafter (A) and the speculative engine (B, EAGLE 3.1,
K = --max-depth) are started once, both held, and driven one at a time in turns of a few
seconds: per alternation and concurrency the turns run A, A', B0, B4 ... in a seeded
random order (A' is A again: the A/A null, the method's own resolution). An idle vLLM
core blocks on its input queue and its workers stop spinning a second after their last
step (turns are --settle apart); the CPU its processes use during the other engine's
turns is printed so that this can be checked, not assumed.

A turn is `bench.floor_parity`'s closed loop (the bench's family prompts, long context
included; greedy, `ignore_eos`, unique first block, reply lengths around --max-tokens,
the first burst not counted): its median TTFT and TPOT (vLLM's per-request figures from
engine-core timestamps) and its engine's CPU seconds per output token (the engine's
processes from /proc: steal and other tenants' time are not in it, so it is the least
noisy reading of work done).

Per concurrency and depth it prints the median, over alternations, of the ratio to A
within an alternation (turns within a minute of each other), with the distribution-free
95 % interval of that median (order statistics of a Binomial(n, 1/2)), for TTFT, TPOT
and CPU per token; the
A/A null row beside them. Targets: k = 0 within 1.03x on TTFT and TPOT, k > 0 TTFT
within 1.2x. A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.floor_parity import closed_loop
from bench.stats import median_interval

NULL = "no drafter (again)"
BASE = "no drafter"
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Turn:
    ttft_s: float
    tpot_s: float
    cpu_per_token_s: float


@dataclass
class Cell:
    """One (concurrency, variant) cell: a Turn per alternation."""

    turns: list[Turn] = field(default_factory=list)


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry))
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.add(child)
            stack.append(child)
    return found


def cpu_seconds(pids: set[int]) -> float:
    """User + system CPU seconds of these processes (all their threads); gone ones read 0."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (stat fields 14, 15)
    return total / TICKS


def turn_order(alternation: int, names: list[str]) -> list[str]:
    """A seeded random order per alternation: every variant equally likely at every place.

    Forward and reversed in turn (A A' B0 B4, B4 B0 A' A) equalises the mean place but
    leaves A and B4 always at a block's edge and A' and B0 always inside it, so a place
    effect (the turn after a change of concurrency or of engine) would not cancel.
    """
    order = list(names)
    random.Random(alternation).shuffle(order)
    return order


async def run_turn(
    engine: Any, pids: set[int], conc: int, k: int, seed: int, args: argparse.Namespace
) -> Turn:
    """`bench.floor_parity`'s closed loop: median TTFT and TPOT, engine CPU per output token."""
    cpu0 = cpu_seconds(pids)
    ttfts, tpots, tokens = await closed_loop(engine, conc, k, seed, args.samples, args.max_tokens)
    cpu = cpu_seconds(pids) - cpu0
    return Turn(statistics.median(ttfts), statistics.median(tpots), cpu / max(tokens, 1))


def variants(depths: list[int], null: bool) -> list[str]:
    names = [BASE, *([NULL] if null else []), *(f"k = {d}" for d in depths)]
    return names


def print_now(line: str) -> None:
    print(line, flush=True)


@contextlib.asynccontextmanager
async def resident_engines(
    args: argparse.Namespace, log: Callable[[str], None]
) -> AsyncIterator[tuple[dict[str, Any], dict[str, set[int]], str]]:
    """Both engines started and held, one after the other: {BASE: without a drafter,
    "speculative": EAGLE 3.1 at K = args.max_depth}, each engine's process ids, and the
    model's description."""
    from bench.k0_overhead import models
    from engine.settings import EngineSettings
    from engine.vllm.engine import VLLMEngine

    target, drafter, described = models(args)
    log(f"model: {described}")
    async with contextlib.AsyncExitStack() as stack:
        engines: dict[str, Any] = {}
        pids: dict[str, set[int]] = {}
        for name, speculative in ((BASE, False), ("speculative", True)):
            before = descendants(os.getpid())
            settings = EngineSettings(
                model=target,
                drafter=drafter if speculative else None,
                max_depth=args.max_depth,
                warmup_prompts=4,
            )
            engines[name] = await stack.enter_async_context(VLLMEngine.started(settings))
            pids[name] = descendants(os.getpid()) - before
            log(f"{name}: engine processes {sorted(pids[name])}")
        yield engines, pids, described


async def run(args: argparse.Namespace) -> dict[str, Any]:
    names = variants(args.depths, args.null)
    cells: dict[tuple[int, str], Cell] = {(c, n): Cell() for c in args.concurrency for n in names}
    idle_cpu = {BASE: 0.0, "speculative": 0.0}
    idle_wall = {BASE: 0.0, "speculative": 0.0}
    async with resident_engines(args, print_now) as (engines, pids, described):
        started = time.perf_counter()
        for a in range(args.alternations):
            for conc in args.concurrency:
                for name in turn_order(a, names):
                    which = BASE if name in (BASE, NULL) else "speculative"
                    other = "speculative" if which == BASE else BASE
                    k = 0 if which == BASE else int(name.split("=")[1])
                    # vLLM's workers spin on their shared-memory queue for a second after
                    # their last read (`shm_broadcast.SpinCondition.busy_loop_s`): let the
                    # engine that ran last fall asleep before the next turn starts.
                    await asyncio.sleep(args.settle)
                    other0, wall0 = cpu_seconds(pids[other]), time.perf_counter()
                    t = await run_turn(engines[which], pids[which], conc, k, 1000 * a + conc, args)
                    idle_cpu[other] += cpu_seconds(pids[other]) - other0
                    idle_wall[other] += time.perf_counter() - wall0
                    cells[(conc, name)].turns.append(t)
            done = time.perf_counter() - started
            print(
                f"[{a + 1}/{args.alternations}] {done:.0f} s; "
                + "; ".join(_brief(cells, c, names, a) for c in args.concurrency),
                flush=True,
            )
    rows = summarise(cells, args.concurrency, names)
    idle = {n: idle_cpu[n] / idle_wall[n] for n in idle_cpu if idle_wall[n]}
    print_table(rows, args.alternations, idle)
    turns = {
        f"c{c} {n}": [[t.ttft_s, t.tpot_s, t.cpu_per_token_s] for t in cell.turns]
        for (c, n), cell in cells.items()
    }
    return {
        "command": " ".join(sys.argv),
        "model": described,
        "rows": rows,
        "idle": idle,
        "turns [ttft_s, tpot_s, cpu_per_token_s]": turns,
    }


def _brief(cells: dict[tuple[int, str], Cell], conc: int, names: list[str], a: int) -> str:
    base = cells[(conc, BASE)].turns[a]
    parts = [
        f"{n} {cells[(conc, n)].turns[a].tpot_s / base.tpot_s:.2f}" for n in names if n != BASE
    ]
    return f"c{conc} TPOT/A " + ", ".join(parts)


def summarise(
    cells: dict[tuple[int, str], Cell], concurrency: list[int], names: list[str]
) -> list[dict[str, Any]]:
    """Per concurrency and variant: the ratios to A, per alternation, as median and interval."""
    rows = []
    for conc in concurrency:
        base = cells[(conc, BASE)].turns
        for name in names:
            if name == BASE:
                continue
            turns = cells[(conc, name)].turns
            row: dict[str, Any] = {"concurrency": conc, "variant": name, "alternations": len(turns)}
            for metric in ("ttft_s", "tpot_s", "cpu_per_token_s"):
                ratios = [
                    getattr(t, metric) / getattr(b, metric)
                    for b, t in zip(base, turns, strict=True)
                ]
                med, low, high = median_interval(ratios)
                row[metric.removesuffix("_s")] = {
                    "ratio": round(med, 4),
                    "ci95": [round(low, 4), round(high, 4)],
                    "a_ms": round(1e3 * statistics.median(getattr(b, metric) for b in base), 3),
                    "b_ms": round(1e3 * statistics.median(getattr(t, metric) for t in turns), 3),
                }
            rows.append(row)
    return rows


def _ratio(f: dict[str, Any]) -> str:
    return f"{f['ratio']:.3f} [{f['ci95'][0]:.3f}-{f['ci95'][1]:.3f}]"


def print_table(rows: list[dict[str, Any]], alternations: int, idle: dict[str, float]) -> None:
    print(
        f"\nratio to the no-drafter engine: median over {alternations} alternations "
        "[distribution-free 95 % interval]; ms: each engine's median turn"
    )
    print(
        "| c | variant | TTFT ratio | TPOT ratio | CPU/token ratio | TTFT ms A / B "
        "| TPOT ms A / B |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        ttft, tpot, cpu = (_ratio(r[m]) for m in ("ttft", "tpot", "cpu_per_token"))
        print(
            f"| {r['concurrency']} | {r['variant']} | {ttft} | {tpot} | {cpu} | "
            f"{r['ttft']['a_ms']:.1f} / {r['ttft']['b_ms']:.1f} | "
            f"{r['tpot']['a_ms']:.2f} / {r['tpot']['b_ms']:.2f} |"
        )
    shares = ", ".join(f"{n} {100 * v:.1f} %" for n, v in idle.items())
    print(f"\nidle engine's CPU during the other's turns (share of one core): {shares}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--alternations", type=int, default=20)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--no-null", dest="null", action="store_false", help="skip the A/A turn")
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--settle", type=float, default=1.5, help="pause between turns, s")
    parser.add_argument("--samples", type=int, default=8, help="timed requests per turn")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench/results/floor_resident.json"))
    parser.add_argument("--layers", type=int, default=16, help="tiny target layers (no real model)")
    parser.add_argument("--hidden", type=int, default=256, help="tiny target width (no real model)")
    args = parser.parse_args()
    body = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    body["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    args.out.write_text(json.dumps(body, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
