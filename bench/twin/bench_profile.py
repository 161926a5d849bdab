"""A CPU cost profile from a `make bench` run's `summary.json` (`build_profile --bench-summary`).

    python -m bench.twin.build_profile --bench-summary bench/results/summary.json \\
        --zero-skips-drafter \\
        --validation-out bench/twin/measurements/make-bench-cpu-embedded.json \\
        --beyond bench/twin/measurements/cpu-calibration-1.json \\
        --beyond bench/twin/measurements/cpu-calibration-2.json \\
        --beyond bench/twin/measurements/cpu-calibration-3.json \\
        --out bench/twin/profiles/cpu-embedded.json

The run's figures are client-side (through the gateway, the serving layer sharing the cores):
they are what its tokens/s were made of, and the twin's validation compares with those.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from bench.stats import percentile

#: Prompts per family in the pool `bench run` draws from (`bench/__main__.py`).
POOL_PER_FAMILY = 16
#: What rebuilding the run's requests reads of its `meta`.
RUN_FIELDS = ("model_source", "families_source", "seed", "max_tokens", "requests_per_run", "phases")


def _at(body: Mapping[str, Any], *path: str) -> Any:
    """`body[path[0]][path[1]]...`; a missing step is a ValueError naming the path to it."""
    node: Any = body
    for depth, key in enumerate(path):
        if not isinstance(node, Mapping) or key not in node:
            raise ValueError(f"the bench summary has no `{'.'.join(path[: depth + 1])}`")
        node = node[key]
    return node


def _ms(summary: Mapping[str, Any], mode: str, arrival: str, figure: str) -> float:
    """A cell's figure (seconds, median over repeats) in milliseconds."""
    return float(_at(summary, "cells", mode, arrival, figure, "median")) * 1000


def from_bench_summary(
    summary: Mapping[str, Any],
    prompt_tokens: Sequence[int],
    drafter_share: float,
    command: str,
) -> dict[str, Any]:
    """Profile data (without name) from a `make bench` run's `summary.json`.

    `prompt_tokens`: the prompt length of each of the run's requests (every repeat sends the
    same); `drafter_share`: the drafter's prefill per token as a share of the target's (its
    layers over the target's); `command`, the one that rebuilds the profile, is quoted in its
    `source`. Every cell figure is the median over the run's repeats.

    - `batch_stats[N]` = `step_costs["cN"].step_ms` for every closed arrival cN (the static
      modes' decode step, k0's at k = 0); a closed loop of N clients holds at most N requests,
      so N is the batch's upper bound;
    - `no_spec_step_ms[N]` = the no-spec mode's TPOT p50 at cN, capped at `batch_stats[N][0]`:
      a step where no request drafts skips the drafter, so an engine without one is no faster;
    - `prefill_ms_per_token.target` = (TTFT p99 - TTFT p50) / (L p99 - L p50): the no-spec
      mode's TTFT at c1 against the prompt lengths at the same percentiles of the run's
      requests (`bench.stats.percentile`, as the TTFT's); the rest of a short prompt's TTFT
      (HTTP, the serving layer, the first step) has no field in the profile;
      `.drafter` = target x `drafter_share`;
    - `first_token_extra_ms[k]` = static-kK's TTFT p50 at c1 less the k0 mode's, at least 0;
    - `max_k` = the deepest k measured at c1; `workload` = `make-bench`, the twin's copy of
      the benchmark's phases and families.
    """
    step_costs = _at(summary, "step_costs")
    batches = sorted({1} | {int(a[1:]) for a in step_costs if re.fullmatch(r"c\d+", a)})
    stats: dict[int, dict[int, float]] = {}
    for b in batches:
        row = {
            int(k): float(ms) for k, ms in _at(summary, "step_costs", f"c{b}", "step_ms").items()
        }
        if 0 not in row:
            _at(summary, "step_costs", f"c{b}", "step_ms", "0")
        stats[b] = dict(sorted(row.items()))
    tpot = {b: _ms(summary, "no-spec", f"c{b}", "tpot_p50_s") for b in batches}
    short, long = (float(percentile(prompt_tokens, q) or 0.0) for q in (50, 99))
    if long <= short:
        raise ValueError(f"the run's p99 prompt ({long:g} tokens) is not longer than its p50")
    ttft = {q: _ms(summary, "no-spec", "c1", f"ttft_p{q}_s") for q in (50, 99)}
    prefill = (ttft[99] - ttft[50]) / (long - short)
    max_k = max(stats[1])
    first = {
        k: _ms(summary, "k0" if k == 0 else f"static-k{k}", "c1", "ttft_p50_s")
        for k in range(max_k + 1)
    }
    sizes = " / ".join(map(str, batches))
    return {
        "source": (
            f"Built by `{command}` from {_run(summary)}: batch_stats = its static "
            f"modes' step costs at concurrency {sizes}, taken as batch {sizes}; no_spec_step_ms "
            "= the no-spec mode's TPOT p50; prefill and first-token costs from the modes' TTFT "
            "p50 / p99 (notes; the rule: bench.twin.bench_profile.from_bench_summary)."
        ),
        "max_k": max_k,
        "batch_stats": stats,
        "no_spec_step_ms": {b: round(min(tpot[b], stats[b][0]), 2) for b in batches},
        "prefill_ms_per_token": {
            "target": round(prefill, 4),
            "drafter": round(prefill * drafter_share, 4),
        },
        "first_token_extra_ms": {
            k: round(max(first[k] - first[0], 0.0), 2) for k in range(1, max_k + 1)
        },
        "workload": "make-bench",
        "notes": " ".join(
            [
                "Step costs are client-side (through the gateway, the serving layer sharing "
                "the cores), as the run's tokens/s were made of them. A closed loop of N "
                "clients holds at most N requests, fewer while one prefills, and a step also "
                "holds newcomers' prefills: batch N is an upper bound of what the cN steps ran.",
                "no_spec_step_ms: TPOT p50 "
                + ", ".join(f"{tpot[b]:.2f} ms at c{b}" for b in batches)
                + f" against k = 0's {', '.join(f'{stats[b][0]:g}' for b in batches)}, capped "
                "at those.",
                f"Prefill: the no-spec mode's TTFT at c1 is {ttft[50]:.1f} ms at p50 and "
                f"{ttft[99]:.1f} ms at p99; the prompts at those percentiles of the run's "
                f"{len(prompt_tokens)} requests are {short:g} and {long:g} tokens: "
                f"({ttft[99]:.1f} - {ttft[50]:.1f}) / ({long:g} - {short:g}) = {prefill:.4f} ms "
                "per prompt token. Repeats after the first find long prompts in the prefix "
                "cache, so this is a warm figure.",
                f"Drafter prefill: {drafter_share:.4g} of the target's (its decoder layers "
                "over the target's).",
                "first_token_extra_ms: TTFT p50 at c1 "
                + ", ".join(f"k{k} {first[k]:.1f} ms" for k in first)
                + ".",
                "No acceptance_rate_per_pos: the run's batch-schedule mode used the fixed "
                "table of bench/modes.py (BATCH_SCHEDULE), not a profiler's rates.",
            ]
        ),
    }


def _run(summary: Mapping[str, Any]) -> str:
    """The run by its start time (and commit, where its meta records one) and size."""
    meta = _at(summary, "meta")
    commit = f" at commit {meta['commit']}" if meta.get("commit") else ""
    return (
        f"the `make bench` run started {_at(summary, 'meta', 'started')}{commit} "
        f"({len(meta.get('modes') or [])} modes x {len(meta.get('arrivals') or [])} arrivals x "
        f"{meta.get('repeats')} repeats x {meta.get('requests_per_run')} requests of up to "
        f"{meta.get('max_tokens')} tokens, seed {meta.get('seed')}, {meta.get('model_source')}, "
        f"{meta.get('machine')})"
    )


def run_inputs(summary: Mapping[str, Any]) -> tuple[list[int], float]:
    """(each of the run's requests' prompt length, the drafter's prefill share): the requests
    rebuilt as `bench run` drew them (pool, seed, phases) and counted in the embedded target's
    tokenizer and chat template; the share from the drafter's and target's layer counts."""
    from bench.families import fit_pool, load_pool, prompt_tokens
    from bench.workload import build_workload, default_phases
    from engine.model_paths import default_model_paths
    from engine.settings import EngineSettings

    meta = {k: _at(summary, "meta", k) for k in RUN_FIELDS}
    if meta["model_source"] != "embedded default model":
        raise ValueError(
            f"the run used the {meta['model_source']}; only the embedded default model's "
            "tokenizer is at hand to count its prompts"
        )
    seed, max_tokens = int(meta["seed"]), int(meta["max_tokens"])
    pool, here = load_pool(per_family=POOL_PER_FAMILY, seed=seed)
    if here != meta["families_source"]:
        raise ValueError(
            f"the run drew its prompts from {meta['families_source']}, this host {here}"
        )
    phases = default_phases(int(meta["requests_per_run"]) // len(default_phases(1)))
    if ", ".join(f"{p.name} x{p.requests}" for p in phases) != meta["phases"]:
        raise ValueError(f"the run's phases ({meta['phases']}) are not `bench run`'s default")
    paths = default_model_paths()
    pool, _ = fit_pool(pool, paths.target, EngineSettings().max_model_len, max_tokens)
    items = build_workload(phases, pool, seed, max_tokens)
    layers = [
        json.loads((path / "config.json").read_text())["num_hidden_layers"]
        for path in (paths.eagle31, paths.target)
    ]
    return prompt_tokens([i.prompt for i in items], paths.target), layers[0] / layers[1]
