"""Is sampled (temperature > 0) speculation lossless on this vLLM build? Three engines, one run.

Speculative decoding with rejection sampling must leave the target's output
distribution unchanged. Greedy outputs are checked token for token elsewhere
(`tests/model/`); sampling can only be checked statistically. This draws the
same seeded samples from the default model without speculation, with EAGLE 3.1
at k = --k as vLLM ships it, and with EAGLE 3.1 at k = --k and the gateway's
worker extension (`engine.vllm.expand_fix`: the CPU rejection sampler's expand kernel
fixed), then scores every sampled continuation under the target itself (no
speculation, `prompt_logprobs`, raw logits) and prints, per engine and
temperature:

* the mean target log-probability per sampled token (lossless speculation gives
  the same figure within noise: the samples come from the same distribution);
* the share of outputs containing control or U+FFFD characters (bytes a
  well-sampled continuation of this model does not produce at low temperature);
* the acceptance length (1 + accepted drafts / verify steps), what sampled
  speculation yields.

    .venv/bin/python -m bench.sampled_fidelity [--prompts 8] [--seeds 4] [--max-tokens 48]
        [--budget on|vllm-av]

`--budget` adds a fourth engine: the gateway's own engine arguments
(`engine.vllm.engine_args`: its depth-capping scheduler and worker, the expand fix
applied) with the verify budget on, which trims each step's drafts by the drafter's
confidence before they are verified (`engine.vllm.confidence_budget`). Its requests
carry no depth, which the scheduler reads as K; a trim changes which drafts are
verified, never the distribution sampled, so its figures must match the others'.

A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
from pathlib import Path
from typing import Any

from engine.model_paths import ModelPaths, default_model_root
from tools.model.corpus import load_corpus
from tools.model.families import family_prompts
from tools.model.measure import accepted_and_steps, open_llm

#: (prompt ids, sampled ids, text, accepted drafts, verify steps) of one sample.
Drawn = tuple[list[int], list[int], str, int, int]


def _odd(text: str) -> bool:
    return any((ord(c) < 32 and c not in "\n\t") or c == "\ufffd" for c in text)


def sample(
    llm: Any, prompts: list[list[int]], temperature: float, seeds: int, max_tokens: int
) -> list[Drawn]:
    """(prompt ids, sampled ids, text, accepted, steps) for every prompt x seed."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    jobs = [(p, s) for s in range(seeds) for p in prompts]
    params = [
        SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=s) for _, s in jobs
    ]
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in jobs], params, use_tqdm=False)
    return [
        (p, list(o.outputs[0].token_ids), o.outputs[0].text, *accepted_and_steps(o.outputs[0]))
        for (p, _), o in zip(jobs, outs, strict=True)
    ]


def score(llm: Any, samples: list[Drawn]) -> list[float]:
    """Mean target log-probability per sampled token, one figure per sample."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=p + s) for p, s, *_ in samples], params, use_tqdm=False
    )
    figures = []
    for (p, s, *_), out in zip(samples, outs, strict=True):
        rows = out.prompt_logprobs[len(p) : len(p) + len(s)]
        values = [row[tok].logprob for row, tok in zip(rows, s, strict=False) if row and tok in row]
        if values:
            figures.append(statistics.mean(values))
    return figures


def budget_llm(paths: ModelPaths, k: int, mode: str) -> Any:
    """A vLLM `LLM` with the gateway's engine arguments and the verify budget `mode`,
    otherwise as `open_llm` builds the others (eager, bfloat16, 2,048 tokens, seed 0)."""
    from vllm import LLM
    from vllm.engine.arg_utils import AsyncEngineArgs

    from bench.frontend_vs_vllm import changed_engine_args
    from engine.settings import EngineSettings
    from engine.vllm.engine_args import engine_args

    settings = EngineSettings(
        model=paths.target, drafter=paths.eagle31, max_depth=k, verify_budget=mode, dtype="bfloat16"
    )
    changed = changed_engine_args(engine_args(settings), AsyncEngineArgs())
    changed.update(enforce_eager=True, max_model_len=2048, seed=0)
    return LLM(**changed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=default_model_root())
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 0.7])
    ap.add_argument("--json", type=Path, default=None, help="Also write the figures here.")
    ap.add_argument(
        "--budget",
        choices=("on", "vllm-av"),
        help="also the gateway's engine with this verify budget (module docstring)",
    )
    args = ap.parse_args()
    paths = ModelPaths(args.root)
    chats = family_prompts(load_corpus(), "chat_main", "heldout", args.prompts)

    shipped = f"EAGLE 3.1 k={args.k}, vLLM as shipped"
    fixed = f"EAGLE 3.1 k={args.k}, gateway worker (expand fix)"
    plain = "no speculation"
    budget = f"EAGLE 3.1 k={args.k}, gateway engine, verify budget {args.budget}"
    engines = (
        (shipped, paths.eagle31, args.k, ""),
        (fixed, paths.eagle31, args.k, "engine.vllm.worker.SpecGatewayWorker"),
        *([(budget, paths.eagle31, args.k, "budget")] if args.budget else []),
        (plain, None, 0, ""),
    )
    # The speculative engines sample first; the plain engine then samples and, being
    # the target without speculation, scores every set: three engine starts, not four.
    drawn: dict[str, dict[float, list[Drawn]]] = {}
    for name, drafter, k, extension in engines:
        if extension == "budget":
            llm: Any = budget_llm(paths, k, args.budget)
        else:
            llm = open_llm(paths.target, drafter, k, worker_extension_cls=extension)
        if extension:
            print(f"{name}: expand kernel {llm.collective_rpc('specgw_fix_expand')}", flush=True)
        tok = llm.get_tokenizer()
        prompts = [
            tok.encode(
                tok.apply_chat_template(c.messages, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            )
            for c in chats
        ]
        drawn[name] = {
            t: sample(llm, prompts, t, args.seeds, args.max_tokens) for t in args.temperatures
        }
        if k:
            del llm
            gc.collect()

    results: dict[str, dict[str, Any]] = {}
    for name, *_ in engines:
        for t, samples in drawn[name].items():
            lp = score(llm, samples)
            odd = sum(_odd(text) for _, _, text, _, _ in samples)
            accepted, steps = sum(s[3] for s in samples), sum(s[4] for s in samples)
            acceptance = round(1 + accepted / steps, 3) if steps else None
            results.setdefault(name, {})[str(t)] = {
                "samples": len(samples),
                "mean_target_logprob": round(statistics.mean(lp), 3),
                "stdev_of_sample_means": round(statistics.stdev(lp), 3),
                "odd_outputs": odd,
                "acceptance_length": acceptance,
            }
            print(
                f"{name}, temperature {t}: mean target log-prob per token "
                f"{statistics.mean(lp):.3f} (sd {statistics.stdev(lp):.3f}, {len(lp)} samples), "
                f"{odd}/{len(samples)} outputs with control/U+FFFD characters, "
                f"acceptance length {acceptance}",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
