"""In-process engines for the instruments that drive `engine.vllm` directly (no gateway).

The model pair they run, the prompts they send, one request to its outcome, and the CPU
time of an engine's processes read from /proc (`bench.gateway_proc.descendants` finds
them). Shared by `bench.floor_interleaved`, `bench.prefix_cache` and `bench.mixed_step_cpu`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.interface import RequestOutcome

#: Short prompts of several kinds, for instruments that need no prompt families.
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
TICKS = os.sysconf("SC_CLK_TCK")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """The tiny pair's shape, used only where the embedded default model is not built."""
    parser.add_argument("--layers", type=int, default=16, help="tiny target layers (no real model)")
    parser.add_argument("--hidden", type=int, default=256, help="tiny target width (no real model)")


def models(args: argparse.Namespace) -> tuple[Path, Path, str]:
    """(target, drafter, description): the embedded default model and its EAGLE 3.1
    drafter when built, else a tiny random-weight pair of `--layers` x `--hidden`."""
    from engine.model_paths import default_model

    paths = default_model()
    if paths.target.is_dir() and paths.eagle31.is_dir():
        return paths.target, paths.eagle31, f"embedded default model ({paths.target})"
    from tools.model.testing_models import TinyShape, build_tiny_models

    shape = TinyShape(
        layers=args.layers, hidden=args.hidden, intermediate=args.hidden * 2, heads=4, kv_heads=2
    )
    tiny = build_tiny_models(Path(os.environ.get("SPECGW_TEST_MODELS", "/tmp/specgw-tiny")), shape)
    return tiny.target, tiny.drafter, f"tiny random-weight model ({args.layers} x {args.hidden})"


def family_prompts(count: int) -> list[tuple[str, str]]:
    """(family, text) of the benchmark's family prompts, round-robin over the families;
    chat messages joined, each text cut at 4,000 characters (long context included)."""
    from bench.families import load_pool

    pool, _ = load_pool(per_family=max(1, count // 6 + 1), seed=0)
    texts = []
    for batch in zip(*pool.values(), strict=False):
        for p in batch:
            text = p.prompt or "\n".join(str(m.get("content", "")) for m in p.messages or [])
            texts.append((p.family, text[:4000]))
    return texts[:count] if texts else [("none", "Hello")] * count


async def one_request(
    engine: Any,
    text: str,
    k: int,
    max_tokens: int,
    *,
    first: asyncio.Event | None = None,
    cold: bool = True,
    salt: str | None = None,
    extra: dict[str, object] | None = None,
    tokens: list[int] | None = None,
) -> RequestOutcome:
    """One greedy request on an in-process engine to its outcome; sets `first`, where
    given, at its first token, and appends its output token ids to `tokens`. `cold`: a
    unique first block (no prefix-cache hit; `salt` where given, so that every engine
    reads the same prompt, else a random one) and `ignore_eos` (the reply runs to
    `max_tokens`); otherwise the text as it is. `extra`: the request's extra engine args."""
    from engine.interface import GenerateRequest

    head = salt if salt is not None else uuid.uuid4().hex[:8]
    request = GenerateRequest(
        request_id=f"bench-{uuid.uuid4().hex[:12]}",
        prompt=f"#{head}\n{text}" if cold else text,
        max_tokens=max_tokens,
        k=k,
        ignore_eos=cold,
        extra=dict(extra or {}),
    )
    async for chunk in engine.generate(request):
        if first is not None and (chunk.token_ids_delta or chunk.outcome is not None):
            first.set()
        if tokens is not None:
            tokens.extend(chunk.token_ids_delta)
        if chunk.outcome is not None:
            outcome: RequestOutcome = chunk.outcome
            return outcome
    raise RuntimeError("stream ended without an outcome")


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
