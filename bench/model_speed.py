"""Output tokens/s at concurrency 1: the default model with EAGLE 3.1 (k = 3) vs no speculation.

Both engines run in this one process, one after the other (never two at once
on the shared cores), on the same held-out `chat_main` prompts with greedy
decoding, so they generate the same tokens; each request is sent alone and the
figure is total output tokens over total wall time. Usage:

    .venv/bin/python -m bench.model_speed [--prompts 12] [--max-tokens 128] [--k 3]
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

from engine.model_paths import ModelPaths, default_model_root
from tools.model.corpus import load_corpus
from tools.model.families import FamilyPrompt, family_prompts
from tools.model.measure import open_llm


def run_phase(
    paths: ModelPaths, k: int, prompts: list[FamilyPrompt], max_tokens: int
) -> dict[str, Any]:
    """Load one engine, warm it up, send the prompts one at a time; tokens/s and acceptance."""
    from vllm import SamplingParams

    llm: Any = open_llm(paths.target, paths.eagle31 if k else None, k)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    llm.chat(prompts[0].messages, params, use_tqdm=False)  # warm-up, not timed
    tokens = accepted = steps = 0
    start = time.perf_counter()
    for p in prompts:
        out = llm.chat(p.messages, params, use_tqdm=False)[0].outputs[0]
        tokens += len(out.token_ids)
        if out.spec_decode_metrics is not None:
            hist = list(out.spec_decode_metrics.histogram)
            accepted += sum(j * c for j, c in enumerate(hist))
            steps += sum(hist)
    seconds = time.perf_counter() - start
    del llm
    gc.collect()
    return {
        "k": k,
        "output_tokens": tokens,
        "seconds": round(seconds, 2),
        "tokens_per_s": round(tokens / seconds, 1),
        "acceptance_length": round(1 + accepted / steps, 3) if steps else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=default_model_root())
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    args = ap.parse_args()
    prompts = family_prompts(load_corpus(), "chat_main", "heldout", args.prompts)
    paths = ModelPaths(args.root)
    plain = run_phase(paths, 0, prompts, args.max_tokens)
    print("no speculation:", json.dumps(plain), flush=True)
    spec = run_phase(paths, args.k, prompts, args.max_tokens)
    print(f"EAGLE 3.1 k={args.k}:", json.dumps(spec), flush=True)
    ratio = spec["tokens_per_s"] / plain["tokens_per_s"]
    print(f"speed-up at concurrency 1: {ratio:.2f}x")
    if args.json:
        args.json.write_text(json.dumps({"plain": plain, "spec": spec, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
