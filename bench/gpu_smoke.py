"""`make gpu-smoke`: the first thing to run on a new GPU host.

Starts the gateway on a target and an EAGLE-3 / 3.1 drafter (Hugging Face ids or
directories), replays the benchmark's request families (`bench.families`) through
the official `openai` client in three phases on the same engine (the adaptive
controller, static k = K, and no speculation: every request at k = 0), and prints
per class the requests, mean k and acceptance length, per phase the output
tokens/s, and every error. Exit status 1 on an error, a stream that ended
without a finish reason, or a greedy output that differs with and without
speculation (speculative decoding is lossless: the target verifies every token;
vLLM's batch-shape numerics can in rare cases flip a near-tie, which this reports
as a difference all the same).

`--dry` runs the same script on the CPU build against the embedded model (or the
tiny test model where it is not built): the script itself is tested in CI.

    python -m bench.gpu_smoke --model meta-llama/Llama-3.1-8B-Instruct \\
        --drafter RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3
    python -m bench.gpu_smoke --dry --per-family 1 --max-tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import openai

from bench.families import FAMILIES, SAMPLED_FAMILY, fit_pool, load_pool
from bench.gateway_proc import (
    BENCH_KEY,
    GatewayConfig,
    GatewayProcess,
    ModelPaths,
    model_paths,
    start_gateway,
    write_flags,
)
from bench.replay import request_kwargs
from bench.workload import WorkItem

#: The gateway polls its flags file; a phase starts after this (`bench.runner`).
FLAG_SETTLE_S = 1.5
CUDA_VLLM = "0.33.0"


@dataclass(slots=True)
class SmokeRecord:
    """One request of one phase: what it returned and how it ended."""

    phase: str
    index: int
    family: str
    greedy: bool
    text: str = ""
    finish_reason: str | None = None
    output_tokens: int = 0
    gw_class: str | None = None
    k: int | None = None
    acceptance_length: float | None = None
    error: str | None = None


@dataclass(slots=True)
class PhaseResult:
    name: str
    wall_s: float
    records: list[SmokeRecord] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        tokens = sum(r.output_tokens for r in self.records)
        return tokens / self.wall_s if self.wall_s > 0 else 0.0


def phases(max_depth: int) -> list[tuple[str, dict[str, Any]]]:
    """(name, flags) of the three phases, all on the one engine."""
    return [
        ("adaptive", {"controller-mode": "adaptive", "pin-k": -1}),
        (f"static-k{max_depth}", {"controller-mode": "static", "pin-k": max_depth}),
        ("no-spec", {"speculation-enabled": False}),
    ]


#: The engine's context (`EngineSettings.max_model_len` default): prompts that do not fit
#: with their completion are left out, as `make bench` leaves them out.
MAX_MODEL_LEN = 2048


def work_items(per_family: int, max_tokens: int, seed: int, target: Path) -> list[WorkItem]:
    """The benchmark's families (and its sampled chat), `per_family` prompts each."""
    pool, _ = fit_pool(load_pool(per_family, seed)[0], target, MAX_MODEL_LEN, max_tokens)
    names = [*FAMILIES, SAMPLED_FAMILY]
    prompts = [(name, p) for name in names for p in pool.get(name, [])[:per_family]]
    return [
        WorkItem(i, 0, "smoke", family, prompt, max_tokens)
        for i, (family, prompt) in enumerate(prompts)
    ]


async def send(client: openai.AsyncOpenAI, item: WorkItem, model: str, phase: str) -> SmokeRecord:
    """One streamed request; its text, its finish reason and the gateway's speculation."""
    greedy = not item.prompt.extra.get("temperature")
    rec = SmokeRecord(phase, item.index, item.family, greedy)
    parts: list[str] = []
    try:
        kwargs = request_kwargs(item, model)
        api = client.chat.completions if item.prompt.is_chat else client.completions
        stream = await api.create(**kwargs)
        async for chunk in stream:
            _take_chunk(rec, chunk, parts)
    except openai.OpenAIError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    rec.text = "".join(parts)
    return rec


def _take_chunk(rec: SmokeRecord, chunk: Any, parts: list[str]) -> None:
    for choice in getattr(chunk, "choices", None) or []:
        delta = getattr(choice, "delta", None)
        text = getattr(delta, "content", None) if delta is not None else choice.text
        parts.append(text or "")
        for call in getattr(delta, "tool_calls", None) or []:
            function = getattr(call, "function", None)
            parts.append(getattr(function, "arguments", None) or "")
        rec.finish_reason = choice.finish_reason or rec.finish_reason
    usage = getattr(chunk, "usage", None)
    if usage is not None:
        rec.output_tokens = int(usage.completion_tokens or 0)
    spec = (getattr(chunk, "model_extra", None) or {}).get("speculation")
    if isinstance(spec, dict):
        rec.gw_class = str(spec.get("class"))
        rec.k = int(spec.get("k", -1))
        rec.acceptance_length = float(spec.get("acceptance_length", 1.0))


async def run_phase(
    gw: GatewayProcess, name: str, items: list[WorkItem], concurrency: int, timeout_s: float
) -> PhaseResult:
    """All items through `concurrency` clients; the phase's wall time."""
    client = openai.AsyncOpenAI(
        base_url=f"{gw.base_url}/v1", api_key=BENCH_KEY, timeout=timeout_s, max_retries=0
    )
    queue: asyncio.Queue[WorkItem] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    result = PhaseResult(name, 0.0)

    async def worker() -> None:
        while not queue.empty():
            result.records.append(await send(client, queue.get_nowait(), gw.model, name))

    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        await client.close()
    result.wall_s = time.perf_counter() - start
    result.records.sort(key=lambda r: r.index)
    return result


def failures(results: list[PhaseResult]) -> list[str]:
    """Errors, streams without a finish reason, greedy outputs that differ across phases."""
    found = [
        f"{r.phase} #{r.index} {r.family}: {r.error or 'stream ended without a finish reason'}"
        for result in results
        for r in result.records
        if r.error or not r.finish_reason
    ]
    spec, plain = results[1], results[-1]  # static k = K against no speculation
    by_index = {r.index: r for r in plain.records}
    for r in spec.records:
        other = by_index.get(r.index)
        if other is None or not r.greedy or r.error or other.error or r.text == other.text:
            continue
        at = next(
            (i for i, (a, b) in enumerate(zip(r.text, other.text, strict=False)) if a != b),
            min(len(r.text), len(other.text)),
        )
        found.append(
            f"greedy output of #{r.index} {r.family} differs at character {at} "
            f"between {spec.name} and {plain.name}"
        )
    return found


def report(results: list[PhaseResult]) -> str:
    """Per phase tokens/s (and against no speculation); per class n, mean k, acceptance."""
    plain = results[-1].tokens_per_s
    lines = ["phase            tokens/s   vs no-spec"]
    for result in results:
        ratio = result.tokens_per_s / plain if plain > 0 else 0.0
        lines.append(f"{result.name:<16} {result.tokens_per_s:>8.1f}   {ratio:>6.2f}x")
    for result in results[:-1]:
        lines.append(f"\n{result.name}: class                     n   mean k   acceptance length")
        classes: dict[str, list[SmokeRecord]] = {}
        for r in result.records:
            classes.setdefault(r.gw_class or "?", []).append(r)
        for name, recs in sorted(classes.items()):
            ks = [r.k for r in recs if r.k is not None]
            acc = [r.acceptance_length for r in recs if r.acceptance_length is not None]
            mean_k = sum(ks) / len(ks) if ks else float("nan")
            mean_acc = sum(acc) / len(acc) if acc else float("nan")
            lines.append(f"  {name:<30} {len(recs):>3}   {mean_k:>6.2f}   {mean_acc:>8.2f}")
    return "\n".join(lines)


def _models(args: argparse.Namespace, workdir: Path) -> ModelPaths:
    if args.dry:
        return model_paths(workdir / "tiny")
    if not args.model or not args.drafter:
        raise SystemExit("gpu-smoke: --model and --drafter are required (or --dry)")
    from engine.vllm.compat import installed_vllm_version

    if installed_vllm_version() != CUDA_VLLM:
        raise SystemExit(f"gpu-smoke: needs vllm {CUDA_VLLM} (make gpu-smoke installs it)")
    return ModelPaths(Path(args.model), Path(args.drafter), "given")


async def smoke(args: argparse.Namespace, workdir: Path) -> int:
    models = _models(args, workdir)
    env = {} if args.dry else {"SPECGW_ENGINE_ENFORCE_EAGER": "false"}
    config = GatewayConfig("smoke", drafter=True, max_depth=args.max_depth, env=env)
    print(f"gpu-smoke: target {models.target}, drafter {models.drafter} ({models.source})")
    gw = start_gateway(config, models, workdir, timeout_s=args.start_timeout)
    try:
        items = work_items(args.per_family, args.max_tokens, args.seed, models.target)
        # First requests pay one-off costs (graph capture, compilation): not in a phase.
        await run_phase(gw, "warm-up", items[: args.concurrency], args.concurrency, args.timeout)
        results = []
        for name, flags in phases(args.max_depth):
            write_flags(gw.flags_dir, flags)
            await asyncio.sleep(FLAG_SETTLE_S)
            results.append(await run_phase(gw, name, items, args.concurrency, args.timeout))
    finally:
        gw.stop()
    print(report(results))
    problems = failures(results)
    (workdir / "gpu_smoke.json").write_text(
        json.dumps([asdict(r) for result in results for r in result.records], indent=1)
    )
    for problem in problems:
        print(f"FAIL {problem}")
    print(f"gpu-smoke: {'FAILED' if problems else 'ok'} ({len(items)} requests x 3 phases)")
    return 1 if problems else 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="gpu-smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="Target: Hugging Face id or directory.")
    parser.add_argument("--drafter", help="EAGLE-3 / 3.1 drafter: Hugging Face id or directory.")
    parser.add_argument("--dry", action="store_true", help="CPU build, embedded model.")
    parser.add_argument("--max-depth", type=int, default=4, help="K.")
    parser.add_argument("--per-family", type=int, default=4, help="Prompts per family.")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300.0, help="Seconds per request.")
    parser.add_argument("--start-timeout", type=float, default=1800.0)
    parser.add_argument("--out", type=Path, help="Folder for logs and gpu_smoke.json.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        return asyncio.run(smoke(args, args.out))
    with tempfile.TemporaryDirectory(prefix="specgw-smoke-") as tmp:
        return asyncio.run(smoke(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
