"""A/B of one engine change at k = 0: engine A and engine B alternated A B B A ...

    python -m bench.floor_abba [--alternations 6] [--concurrency 1 4]

A = the speculative engine as it is; B = the same engine with the EAGLE-3 aux
hidden-state capture kept in depth-0 steps (`bench.floor_timers.AuxKeptWorker`,
what the engine did before `engine.vllm.draft_skip._aux_capture`). One engine at a time;
each turn starts it, runs the same k = 0 greedy requests (`bench.floor_profile`'s
prompts) at each concurrency and shuts it down. Prints per concurrency the median
and min-max over turns of each engine's median TPOT and TTFT, and the median of the
per-pair ratios B / A. A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics

from bench.floor_profile import _one, prompts

VARIANTS = {
    "A (aux skipped)": "bench.floor_timers.FloorProfileWorker",
    "B (aux kept)": "bench.floor_timers.AuxKeptWorker",
}


def abba_order(alternations: int, names: list[str]) -> list[str]:
    """A B B A A B ...: each pair of turns runs both, in alternating order."""
    order: list[str] = []
    for i in range(alternations):
        order += names if i % 2 == 0 else names[::-1]
    return order


def spread(values: list[float], scale: float = 1e3) -> str:
    return (
        f"{scale * statistics.median(values):.3f} "
        f"[{scale * min(values):.3f}-{scale * max(values):.3f}]"
    )


async def turn(worker_cls: str, args: argparse.Namespace) -> dict[int, tuple[float, float]]:
    """(median TPOT s, median TTFT s) per concurrency on one fresh engine."""
    from bench.k0_overhead import models
    from engine.settings import EngineSettings
    from engine.vllm.engine import VLLMEngine

    target, drafter, _ = models(args)
    settings = EngineSettings(
        model=target,
        drafter=drafter,
        max_depth=4,
        warmup_prompts=4,
        extra_args={"worker_extension_cls": worker_cls},
    )
    figures = {}
    texts = prompts(args.requests)
    async with VLLMEngine.started(settings) as engine:
        for conc in args.concurrency:
            tpots, ttfts = [], []
            for start in range(0, len(texts), conc):
                batch = texts[start : start + conc]
                outs = await asyncio.gather(*(_one(engine, t, 0, args.max_tokens) for t in batch))
                tpots += [o.tpot_s for o in outs]
                ttfts += [o.ttft_s for o in outs]
            figures[conc] = (statistics.median(tpots), statistics.median(ttfts))
    return figures


async def run(args: argparse.Namespace) -> None:
    names = list(VARIANTS)
    seen: dict[str, list[dict[int, tuple[float, float]]]] = {n: [] for n in names}
    for name in abba_order(args.alternations, names):
        seen[name].append(await turn(VARIANTS[name], args))
        print(f"{name}: {seen[name][-1]}", flush=True)
    for conc in args.concurrency:
        print(f"\nconcurrency {conc}: median [min-max] over {args.alternations} turns each")
        for name in names:
            tpot = [f[conc][0] for f in seen[name]]
            ttft = [f[conc][1] for f in seen[name]]
            print(f"  {name:<16} TPOT ms {spread(tpot)}   TTFT ms {spread(ttft)}")
        a, b = seen[names[0]], seen[names[1]]
        tpot_r = [y[conc][0] / x[conc][0] for x, y in zip(a, b, strict=True)]
        ttft_r = [y[conc][1] / x[conc][1] for x, y in zip(a, b, strict=True)]
        print(f"  B/A per pair: TPOT {spread(tpot_r, 1)}   TTFT {spread(ttft_r, 1)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--alternations", type=int, default=6)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--requests", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--layers", type=int, default=16, help="tiny target layers (no real model)")
    parser.add_argument("--hidden", type=int, default=256, help="tiny target width (no real model)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
