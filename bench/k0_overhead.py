"""What k = 0 costs on the speculative engine, and tokens/s at each depth, in one run.

    python -m bench.k0_overhead [--concurrency 1 4] [--max-tokens 128] [--rounds 2]

Runs a no-speculation engine, then (after shutting it down, never two at once)
the speculative engine (alternating --repeat times) with K = --max-depth, on the same prompts:

* TPOT of k = 0 requests on each, and their ratio (goal: at most 1.05x; vLLM's
  own dynamic-SD k = 0 costs 1.07x to 1.22x, vLLM issue 49548);
* tokens/s and mean acceptance length at k = 0..K.

Uses the embedded default model when its artifacts exist, else a tiny
random-weight pair (--layers x --hidden), and says which. TPOT is vLLM's own
per-request figure (engine-core timestamps), averaged over requests; tokens/s
is output tokens over wall time for a whole batch of `concurrency` requests.
A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.interface import RequestOutcome

PROMPTS = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The JSON encoder turns Python objects into",
    "import json\n\ndata = json.loads(",
    "class Point:\n    def __init__(self, x, y):",
    "Write a short note about the weather in spring.",
    "for i in range(10):\n    print(",
    "SELECT name, count(*) FROM users GROUP BY",
    "Once upon a time, in a small village,",
)


@dataclass(frozen=True)
class Figure:
    tpot_s: float
    tokens_per_s: float
    acceptance_length: float


def models(args: argparse.Namespace) -> tuple[Path, Path, str]:
    try:
        from engine.model_paths import default_model
    except ImportError:
        pass
    else:
        paths = default_model()
        if paths.target.is_dir() and paths.eagle31.is_dir():
            return paths.target, paths.eagle31, f"embedded default model ({paths.target})"
    from tools.model.testing_models import TinyShape, build_tiny_models

    shape = TinyShape(
        layers=args.layers, hidden=args.hidden, intermediate=args.hidden * 2, heads=4, kv_heads=2
    )
    tiny = build_tiny_models(Path(os.environ.get("SPECGW_TEST_MODELS", "/tmp/specgw-tiny")), shape)
    return tiny.target, tiny.drafter, f"tiny random-weight model ({args.layers} x {args.hidden})"


async def outcome_of(engine: Any, prompt: str, k: int, max_tokens: int) -> RequestOutcome:
    """Run one greedy request on an in-process engine to its end; its outcome."""
    from engine.interface import GenerateRequest

    request = GenerateRequest(
        request_id=f"bench-{uuid.uuid4().hex[:12]}", prompt=prompt, max_tokens=max_tokens, k=k
    )
    async for chunk in engine.generate(request):
        if chunk.outcome is not None:
            outcome: RequestOutcome = chunk.outcome
            return outcome
    raise RuntimeError("stream ended without an outcome")


async def measure(engine: object, k: int, concurrency: int, max_tokens: int, rounds: int) -> Figure:
    async def one(prompt: str) -> RequestOutcome:
        return await outcome_of(engine, prompt, k, max_tokens)

    tpots, rates, als = [], [], []
    for r in range(rounds):
        batch = [PROMPTS[(r * concurrency + i) % len(PROMPTS)] for i in range(concurrency)]
        start = time.perf_counter()
        outcomes = await asyncio.gather(*(one(p) for p in batch))
        wall = time.perf_counter() - start
        tpots.append(statistics.fmean(o.tpot_s for o in outcomes))
        rates.append(sum(o.output_tokens for o in outcomes) / wall)
        als.append(statistics.fmean(o.speculation.acceptance_length for o in outcomes))
    return Figure(statistics.median(tpots), statistics.median(rates), statistics.fmean(als))


async def run(args: argparse.Namespace) -> None:
    from engine.settings import EngineSettings
    from engine.vllm.engine import VLLMEngine

    target, drafter, which = models(args)
    print(f"model: {which}")
    base = EngineSettings(
        model=target,
        drafter=None,
        max_depth=args.max_depth,
        kv_cache_gib=2,
        max_model_len=1024,
        dtype=args.dtype,
        warmup_prompts=4,
    )
    nospec: dict[int, Figure] = {}
    spec: dict[tuple[int, int], Figure] = {}
    ratios: dict[int, list[float]] = {c: [] for c in args.concurrency}
    # Engines alternate (never two at once) so slow drift in machine load hits both.
    for _ in range(args.repeat):
        async with VLLMEngine.started(base) as engine:
            for c in args.concurrency:
                nospec[c] = await measure(engine, 0, c, args.max_tokens, args.rounds)
        async with VLLMEngine.started(base.model_copy(update={"drafter": drafter})) as engine:
            print(f"drafter skipped in k = 0-only steps: {engine.draft_skip}")
            for c in args.concurrency:
                for k in args.depths or range(args.max_depth + 1):
                    spec[(k, c)] = await measure(engine, k, c, args.max_tokens, args.rounds)
        for c in args.concurrency:
            ratios[c].append(spec[(0, c)].tpot_s / nospec[c].tpot_s)
    if args.repeat > 1:
        for c in args.concurrency:
            shown = ", ".join(f"{r:.3f}" for r in ratios[c])
            print(
                f"k = 0 TPOT ratio, concurrency {c}, per repeat: {shown}; "
                f"median {statistics.median(ratios[c]):.3f}x"
            )
    report(nospec, spec, args)


def report(
    nospec: dict[int, Figure], spec: dict[tuple[int, int], Figure], args: argparse.Namespace
) -> None:
    print(f"\nk = 0 TPOT, speculative engine (K = {args.max_depth}) vs no speculative config")
    print(f"{'conc':>4} {'no-spec ms':>11} {'spec k=0 ms':>12} {'ratio':>7}  goal <= 1.05x")
    for c in args.concurrency:
        a, b = nospec[c].tpot_s * 1e3, spec[(0, c)].tpot_s * 1e3
        print(f"{c:>4} {a:>11.3f} {b:>12.3f} {b / a:>6.3f}x")
    depths = sorted({k for k, _ in spec})
    print("\ntokens/s by depth k (mean acceptance length in brackets)")
    header = " ".join(f"{'k=' + str(k):>14}" for k in depths)
    print(f"{'conc':>4} {'no-spec':>10} {header}")
    for c in args.concurrency:
        cells = " ".join(
            f"{spec[(k, c)].tokens_per_s:>7.1f} ({spec[(k, c)].acceptance_length:.2f})"
            for k in depths
        )
        print(f"{c:>4} {nospec[c].tokens_per_s:>10.1f} {cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeat", type=int, default=1, help="alternate the two engines N times")
    parser.add_argument(
        "--depths", type=int, nargs="+", help="depths to measure (default 0..K; 0 is always kept)"
    )
    parser.add_argument("--layers", type=int, default=16, help="tiny target layers (no real model)")
    parser.add_argument("--hidden", type=int, default=256, help="tiny target width (no real model)")
    args = parser.parse_args()
    if args.depths is not None:
        args.depths = sorted({0, *args.depths})
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
