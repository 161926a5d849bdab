"""Where the speculative engine spends time at k = 0 that an engine without a drafter does not.

    python -m bench.floor_profile [--concurrency 1 4] [--depths 0 4] [--repeat 2]

Starts an engine without a drafter, then (after shutting it down, never two at
once) the speculative engine, alternating `--repeat` times, each with the timers of
`bench.floor_timers` loaded through vLLM's `worker_extension_cls` and
`scheduler_cls`. On each it runs the same greedy requests (the benchmark's
families as plain text, each with a unique first line so that no prefill is a
prefix-cache hit) at each concurrency, k = 0 on both and `--depths` on the
speculative one, and prints per phase (prefill steps, decode steps) the
milliseconds per step of each timed component, plus TTFT and TPOT medians.

Rows are inclusive timers: `core.step` (the engine core's whole step) holds
`core.schedule`, `core.update_from_output` and the round trip to the worker process,
which holds `execute_model` and `sample_tokens`; `executor+ipc` is `core.step` less
those four. A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from bench.floor_timers import Totals

#: Rows of the table, in order: (component, what it is).
ROWS: tuple[tuple[str, str], ...] = (
    ("core.step", "engine core step, all of it"),
    ("core.schedule", "scheduler (depth cap) schedule()"),
    ("core.update_from_output", "update_from_output (+ step clock, per-request metrics)"),
    ("core.post_step", "draft pickup after the step"),
    ("executor+ipc", "core.step - schedule - update - worker calls"),
    ("execute_model", "worker: execute_model"),
    ("_update_states", "  persistent batch update"),
    ("_prepare_inputs", "  input preparation"),
    ("_calc_spec_decode_metadata", "    spec-decode metadata"),
    ("_get_slot_mappings", "  slot mappings"),
    ("_build_attention_metadata", "  attention metadata"),
    ("_preprocess", "  input ids / embeddings"),
    ("_model_forward", "  target forward"),
    ("aux_hidden_capture", "    EAGLE-3 aux hidden-state capture"),
    ("sample_tokens", "worker: sample_tokens"),
    ("_sample", "  sampler / rejection sampler"),
    ("_bookkeeping_sync", "  output bookkeeping"),
    ("propose_draft_token_ids", "  drafter (prefill KV pass and drafts)"),
    ("take_draft_token_ids", "worker: take_draft_token_ids"),
)
PHASES = ("prefill", "decode")


@dataclass
class Case:
    """One column: an engine and a depth, with its timers summed over repeats."""

    name: str
    totals: Totals = field(default_factory=dict)
    ttfts: list[float] = field(default_factory=list)
    tpots: list[float] = field(default_factory=list)

    def absorb(self, totals: Iterable[Totals]) -> None:
        for part in totals:
            for phase, components in part.items():
                mine = self.totals.setdefault(phase, {})
                for name, (seconds, calls) in components.items():
                    cell = mine.setdefault(name, [0.0, 0.0])
                    cell[0] += seconds
                    cell[1] += calls

    def steps(self, phase: str) -> int:
        return int(self.totals.get(phase, {}).get("core.step", [0.0, 0.0])[1])

    def ms_per_step(self, phase: str, component: str) -> float | None:
        """Milliseconds per step of `phase` spent in `component` (None: never called)."""
        steps = self.steps(phase)
        cells = self.totals.get(phase, {})
        if steps == 0:
            return None
        if component == "executor+ipc":
            if "core.step" not in cells:
                return None
            parts = ("core.schedule", "core.update_from_output", "execute_model", "sample_tokens")
            rest = cells["core.step"][0] - sum(cells.get(p, [0.0])[0] for p in parts)
            return 1e3 * rest / steps
        if component not in cells:
            return None
        return 1e3 * cells[component][0] / steps


def table(cases: list[Case], phase: str) -> str:
    """The attribution table of one phase: a row per component, a column per case."""
    width = max(12, *(len(c.name) + 1 for c in cases))
    head = f"{'component (' + phase + ', ms/step)':<34}" + "".join(
        f"{c.name:>{width}}" for c in cases
    )
    lines = [head, f"{'steps':<34}" + "".join(f"{c.steps(phase):>{width}}" for c in cases)]
    for component, _ in ROWS:
        values = [c.ms_per_step(phase, component) for c in cases]
        if all(v is None for v in values):
            continue
        cells = "".join(f"{'-':>{width}}" if v is None else f"{v:>{width}.3f}" for v in values)
        lines.append(f"{component:<34}{cells}")
    return "\n".join(lines)


def latency_line(cases: list[Case]) -> str:
    parts = []
    for c in cases:
        if c.ttfts:
            parts.append(
                f"{c.name}: TTFT p50 {1e3 * statistics.median(c.ttfts):.2f} ms, "
                f"TPOT p50 {1e3 * statistics.median(c.tpots):.3f} ms (n={len(c.ttfts)})"
            )
    return "\n".join(parts)


def prompts(count: int) -> list[str]:
    """Text of the benchmark's family prompts (chat messages joined), round-robin."""
    return [text for _, text in family_prompts(count)]


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


async def _one(
    engine: Any, text: str, k: int, max_tokens: int, first: asyncio.Event | None = None
) -> Any:
    """One greedy request to its outcome; sets `first`, where given, at its first token."""
    from engine.interface import GenerateRequest

    request = GenerateRequest(
        request_id=f"floor-{uuid.uuid4().hex[:12]}",
        prompt=f"#{uuid.uuid4().hex[:8]}\n{text}",  # unique first block: no prefix hit
        max_tokens=max_tokens,
        k=k,
        ignore_eos=True,
    )
    async for chunk in engine.generate(request):
        if first is not None and (chunk.token_ids_delta or chunk.outcome is not None):
            first.set()
        if chunk.outcome is not None:
            return chunk.outcome
    raise RuntimeError("stream ended without an outcome")


async def _take(engine: Any) -> list[Totals]:
    llm = engine._llm  # the bench reads the engine core's utility, not part of the seam
    core: Totals = await llm.engine_core.call_utility_async("specgw_floor_profile")
    workers: list[Totals] = await llm.collective_rpc("specgw_floor_take")
    return [core, *workers]


async def run_case(engine: Any, case: Case, k: int, conc: int, args: argparse.Namespace) -> None:
    texts = prompts(args.requests)
    await _take(engine)  # drop what earlier work left
    for start in range(0, len(texts), conc):
        batch = texts[start : start + conc]
        outcomes = await asyncio.gather(*(_one(engine, t, k, args.max_tokens) for t in batch))
        case.ttfts += [o.ttft_s for o in outcomes]
        case.tpots += [o.tpot_s for o in outcomes]
    case.absorb(await _take(engine))


async def run(args: argparse.Namespace) -> None:
    from bench.k0_overhead import models
    from engine.settings import EngineSettings
    from engine.vllm.engine import VLLMEngine

    target, drafter, which = models(args)
    print(f"model: {which}")
    extra = {
        "worker_extension_cls": "bench.floor_timers.FloorProfileWorker",
        "scheduler_cls": "bench.floor_timers.FloorProfileScheduler",
    }
    base = EngineSettings(
        model=target,
        drafter=None,
        max_depth=args.max_depth,
        dtype=args.dtype,
        warmup_prompts=4,
        extra_args=extra,
    )
    engines = {"no-spec": base, "spec": base.model_copy(update={"drafter": drafter})}
    cases: dict[tuple[int, str], Case] = {}
    for _ in range(args.repeat):
        for engine_name, settings in engines.items():
            async with VLLMEngine.started(settings) as engine:
                await engine._llm.collective_rpc("specgw_floor_install")
                budget = engine._llm.vllm_config.scheduler_config
                print(
                    f"{engine_name}: max_num_scheduled_tokens {budget.max_num_scheduled_tokens}"
                    f", max_num_batched_tokens {budget.max_num_batched_tokens}, "
                    f"chunked prefill {budget.enable_chunked_prefill}"
                )
                depths = [0] if engine_name == "no-spec" else sorted({0, *args.depths})
                for conc in args.concurrency:
                    for k in depths:
                        name = engine_name if engine_name == "no-spec" else f"spec k={k}"
                        case = cases.setdefault((conc, name), Case(name))
                        await run_case(engine, case, k, conc, args)
    for conc in args.concurrency:
        row = [c for (cc, _), c in cases.items() if cc == conc]
        print(f"\n=== concurrency {conc}, {args.repeat} repeat(s), {time.strftime('%H:%M')} ===")
        print(latency_line(row))
        for phase in PHASES:
            print()
            print(table(row, phase))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 4])
    parser.add_argument("--requests", type=int, default=12, help="requests per case and repeat")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--repeat", type=int, default=1, help="alternate the two engines N times")
    parser.add_argument("--layers", type=int, default=16, help="tiny target layers (no real model)")
    parser.add_argument("--hidden", type=int, default=256, help="tiny target width (no real model)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
