"""The speculation floor: TTFT and TPOT of the speculative engine against a no-drafter one.

    python -m bench.floor_parity [--alternations 5] [--concurrency 1 4 16] [--depths 0 4]

Engines on the same target, alternated A B B A ... (A B C C B A with --variants; one at a
time, never two on the cores): A has no drafter; B is the speculative engine (EAGLE 3.1
drafter, K = --max-depth); C, where asked for, the speculative engine with its prefill-only
steps drafting at full depth (`engine.vllm.batch_depth.FIRST_STEP_KEY` off), or with every
step that prefills drafting once (`PREFILL_STEP_KEY` 1).
Each turn starts its engine, runs the benchmark's family prompts (`bench.families`, long
context included; greedy, `ignore_eos`, a unique first block so no prefix hit) at each
concurrency from that many closed-loop clients (concurrency 1: each request alone;
higher: among requests of the same depth), and shuts the engine down. A runs them once
(no drafter); B once per depth in --depths (0 = no speculation on the speculative engine).

Prints, per concurrency and depth, each engine's median over turns of the per-turn median
TTFT and TPOT (vLLM's own per-request figures from engine-core timestamps), with min-max,
and the median and min-max over alternations of the per-pair ratio to A. Targets: k = 0
within 1.03x on both, k > 0 TTFT within 1.2x. Writes the figures as JSON
(--out). A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.floor_abba import abba_order
from bench.floor_profile import _one, prompts
from engine.vllm.batch_depth import FIRST_STEP_KEY, PREFILL_STEP_KEY

#: Turn figures: {(concurrency, depth): (median TTFT s, median TPOT s)}; depth -1 = no drafter.
Figures = dict[tuple[int, int], tuple[float, float]]
NO_DRAFTER = -1
BASE = "no drafter"

#: Engines to alternate: name -> (with the drafter, extra engine arguments).
VARIANTS: dict[str, tuple[bool, dict[str, Any]]] = {
    BASE: (False, {}),
    "speculative": (True, {}),
    # What the engine did before a prefill-only step asked for one draft.
    "first step at full depth": (True, {"additional_config": {FIRST_STEP_KEY: None}}),
    # A step prefilling beside decoding requests drafts once too (`prefill_step_depth`).
    "prefill steps at depth 1": (True, {"additional_config": {PREFILL_STEP_KEY: 1}}),
}


async def turn(variant: str, args: argparse.Namespace) -> Figures:
    """One fresh engine, every concurrency (and depth, when speculative); shut down after."""
    from bench.k0_overhead import models
    from engine.settings import EngineSettings
    from engine.vllm.engine import VLLMEngine

    speculative, extra = VARIANTS[variant]
    target, drafter, _ = models(args)
    settings = EngineSettings(
        model=target,
        drafter=drafter if speculative else None,
        max_depth=args.max_depth,
        warmup_prompts=4,
        extra_args=extra,
    )
    figures: Figures = {}
    async with VLLMEngine.started(settings) as engine:
        for conc in args.concurrency:
            for depth in args.depths if speculative else [NO_DRAFTER]:
                figures[(conc, depth)] = await _cell(engine, conc, max(depth, 0), args)
    return figures


async def _cell(engine: Any, conc: int, k: int, args: argparse.Namespace) -> tuple[float, float]:
    """Median TTFT and TPOT of requests at depth k from `conc` closed-loop clients."""
    ttfts, tpots, _ = await closed_loop(engine, conc, k, conc, args.samples, args.max_tokens)
    return statistics.median(ttfts), statistics.median(tpots)


async def closed_loop(
    engine: Any, conc: int, k: int, seed: int, samples: int, max_tokens: int
) -> tuple[list[float], list[float], int]:
    """TTFTs and TPOTs (seconds) of about `samples` requests at depth k from `conc`
    closed-loop clients, and the output tokens of all the requests sent.

    Each client sends its prompts one after another, with reply lengths drawn (seeded)
    from [max_tokens / 2, 3 max_tokens / 2], so a request meets a batch already
    decoding (as under steady traffic) instead of a burst whose split over engine steps
    decides its first token. Each client's first request (the burst) is not counted.
    """
    per_client = max(2, -(-samples // conc) + 1)
    texts = prompts(per_client * conc)
    # Reply lengths vary (the same sequence for the same seed): equal lengths would end
    # the clients' requests in one step and send the next ones as a burst again.
    rng = random.Random(seed)
    lengths = [rng.randint(max_tokens // 2, 3 * max_tokens // 2) for _ in texts]
    ttfts: list[float] = []
    tpots: list[float] = []
    tokens = 0

    async def client(first: int) -> None:
        nonlocal tokens
        for i, n in enumerate(range(first, len(texts), conc)):
            out = await _one(engine, texts[n], k, lengths[n])
            tokens += out.output_tokens
            if i:
                ttfts.append(out.ttft_s)
                tpots.append(out.tpot_s)

    await asyncio.gather(*(client(i) for i in range(conc)))
    return ttfts, tpots, tokens


def _spread(values: list[float], scale: float = 1.0, digits: int = 3) -> dict[str, float]:
    return {
        "median": round(scale * statistics.median(values), digits),
        "min": round(scale * min(values), digits),
        "max": round(scale * max(values), digits),
    }


def summarise(seen: dict[str, list[Figures]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per speculative engine, concurrency and depth: both engines' figures over turns and
    the per-alternation ratios to the engine without a drafter."""
    rows = []
    base = seen[BASE]
    for variant, turns in seen.items():
        if variant == BASE:
            continue
        for conc in args.concurrency:
            a_ttft = [f[(conc, NO_DRAFTER)][0] for f in base]
            a_tpot = [f[(conc, NO_DRAFTER)][1] for f in base]
            for depth in args.depths:
                b_ttft = [f[(conc, depth)][0] for f in turns]
                b_tpot = [f[(conc, depth)][1] for f in turns]
                rows.append(
                    {
                        "engine": variant,
                        "concurrency": conc,
                        "depth": depth,
                        "no_drafter_ttft_ms": _spread(a_ttft, 1e3),
                        "speculative_ttft_ms": _spread(b_ttft, 1e3),
                        "no_drafter_tpot_ms": _spread(a_tpot, 1e3),
                        "speculative_tpot_ms": _spread(b_tpot, 1e3),
                        "ttft_ratio": _spread([b / a for a, b in zip(a_ttft, b_ttft, strict=True)]),
                        "tpot_ratio": _spread([b / a for a, b in zip(a_tpot, b_tpot, strict=True)]),
                    }
                )
    return rows


def _fmt(s: dict[str, float]) -> str:
    return f"{s['median']:.3f} [{s['min']:.3f}-{s['max']:.3f}]"


def print_table(rows: list[dict[str, Any]], alternations: int) -> None:
    print(
        f"\nmedian [min-max] over {alternations} turns per engine; ratio = the engine's / "
        "the no-drafter engine's, per ABBA pair"
    )
    print(
        "| engine | c | k | TTFT ms no drafter | TTFT ms | TTFT ratio | TPOT ms no drafter "
        "| TPOT ms | TPOT ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['engine']} | {r['concurrency']} | {r['depth']} | "
            f"{_fmt(r['no_drafter_ttft_ms'])} | {_fmt(r['speculative_ttft_ms'])} | "
            f"**{_fmt(r['ttft_ratio'])}** | {_fmt(r['no_drafter_tpot_ms'])} | "
            f"{_fmt(r['speculative_tpot_ms'])} | **{_fmt(r['tpot_ratio'])}** |"
        )


async def run(args: argparse.Namespace) -> None:
    names = [BASE, *(v for v in args.variants if v != BASE)]
    seen: dict[str, list[Figures]] = {name: [] for name in names}
    order = abba_order(args.alternations, names)
    for i, name in enumerate(order, 1):
        figures = await turn(name, args)
        seen[name].append(figures)
        brief = ", ".join(
            f"c{c} k{d}: {1e3 * t:.1f}/{1e3 * p:.2f} ms" for (c, d), (t, p) in figures.items()
        )
        print(f"[{i}/{len(order)}] {name}: TTFT/TPOT {brief}", flush=True)
    rows = summarise(seen, args)
    print_table(rows, args.alternations)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        body = {"command": " ".join(sys.argv), "args": _jsonable(vars(args)), "rows": rows}
        args.out.write_text(json.dumps(body, indent=1) + "\n")
        print(f"\nwrote {args.out}")


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    return {k: str(v) if isinstance(v, Path) else v for k, v in values.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--alternations", type=int, default=5)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 4])
    parser.add_argument(
        "--variants", nargs="+", choices=list(VARIANTS), default=[BASE, "speculative"]
    )
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--samples", type=int, default=24, help="timed requests per cell")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench/results/floor_parity.json"))
    parser.add_argument("--layers", type=int, default=16, help="tiny target layers (no real model)")
    parser.add_argument("--hidden", type=int, default=256, help="tiny target width (no real model)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
