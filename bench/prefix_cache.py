"""What prefix-cache hits cost at k = 0 and k > 0, and what k = 0 blocks do to later drafts.

    python -m bench.prefix_cache [--block-size 128] [--prompts 8] [--notes 30]

Three engines in turn (never two at once), on the embedded default model:

1. no drafter: time to first token of a long prompt, cold and then repeated
   (a prefix-cache hit);
2. speculative, fresh: the same at k = 0 and at k = 4, and the mean acceptance
   length of k = 4 on prompts it has not seen;
3. speculative, after k = 0: each of those prompts first at k = 0, then at k = 4.

Why it exists: on an EAGLE engine vLLM recomputes the last matched block of a
hit (so a hit costs up to a block more than without a drafter), and blocks
filled by a k = 0 request hold no drafter KV (the drafter is skipped). The
scheduler keeps k = 0 requests in their own cache namespace (`engine.vllm.scheduler`),
so row 3's acceptance should equal row 2's; without the namespace it is lower
(2.31 against 2.57 on 16 prompts). `--block-size` overrides the engine's (32 on the
CPU by default, vLLM's own is 128). TTFT is vLLM's per-request figure. A
benchmark: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
from typing import TYPE_CHECKING, Any

from bench.engines import one_request

if TYPE_CHECKING:
    from engine.interface import RequestOutcome

_TOPICS = ("rivers", "taxes", "graphs", "music", "bread", "trains", "stars", "gardens")


def document(seed: int, notes: int) -> str:
    rng = random.Random(seed)
    lines = [f"Note {i}: {rng.choice(_TOPICS)} matters here." for i in range(notes)]
    return f"Document {seed}.\n" + "\n".join(lines) + "\nSummarise the notes."


async def one(engine: Any, prompt: str, k: int, max_tokens: int = 32) -> RequestOutcome:
    return await one_request(engine, prompt, k, max_tokens, cold=False)


async def repeated_ttft(engine: Any, prompt: str, k: int, times: int = 5) -> tuple[float, float]:
    """(cold TTFT, median TTFT of the repeats) in ms."""
    cold = await one(engine, prompt, k, max_tokens=2)
    warm = [await one(engine, prompt, k, max_tokens=2) for _ in range(times)]
    return cold.ttft_s * 1e3, statistics.median(o.ttft_s for o in warm) * 1e3


def mean_al(outcomes: list[RequestOutcome]) -> float:
    return statistics.fmean(o.speculation.acceptance_length for o in outcomes)


async def run(args: argparse.Namespace) -> None:
    from engine.model_paths import default_model
    from engine.settings import EngineSettings
    from engine.vllm.engine import VLLMEngine

    paths = default_model()
    base = EngineSettings(
        model=paths.target,
        drafter=None,
        max_depth=4,
        warmup_prompts=4,
        block_size=args.block_size,
    )
    spec = base.model_copy(update={"drafter": paths.eagle31})
    long_prompt = document(7, args.notes * 2)
    prompts = [document(1000 + i, args.notes) for i in range(args.prompts)]
    rows: list[str] = []

    print("1/3 engine without a drafter", flush=True)
    async with VLLMEngine.started(base) as engine:
        block = engine.block_size
        cold, warm = await repeated_ttft(engine, long_prompt, 0)
        rows.append(f"no drafter, k = 0   cold {cold:7.0f} ms   repeated {warm:7.0f} ms")

    print("2/3 speculative engine, fresh prompts", flush=True)
    async with VLLMEngine.started(spec) as engine:
        for k in (0, 4):
            cold, warm = await repeated_ttft(engine, f"{k} {long_prompt}", k)
            rows.append(f"speculative, k = {k}  cold {cold:7.0f} ms   repeated {warm:7.0f} ms")
        fresh = [await one(engine, p, 4) for p in prompts]

    print("3/3 speculative engine, each prompt first at k = 0", flush=True)
    async with VLLMEngine.started(spec) as engine:
        after = []
        for p in prompts:
            await one(engine, p, 0)
            after.append(await one(engine, p, 4))

    print(f"\nTTFT of a long prompt ({block}-token KV blocks), cold and as a prefix-cache hit")
    print("\n".join(rows))
    print(f"\nk = 4 mean acceptance length on {len(prompts)} prompts")
    print(f"fresh prompts                 {mean_al(fresh):.2f}")
    print(
        f"after a k = 0 run of each     {mean_al(after):.2f}  (cached tokens reused: "
        f"{sum(o.cached_prompt_tokens for o in after)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block-size", type=int, default=None, help="KV block size (tokens)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts for the acceptance rows")
    parser.add_argument("--notes", type=int, default=30, help="lines per prompt (~15 tokens each)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
