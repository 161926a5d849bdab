"""`make gpu-smoke`: the first thing to run on a new GPU host.

Starts the gateway on a target and an EAGLE-3 / 3.1 drafter (Hugging Face ids or
directories), replays the benchmark's request families (`bench.families`) through
the official `openai` client, stops it, then starts a second gateway on the same
target without a drafter (no speculation at all: vLLM's own decode path) and
replays them again; never two engines at once. Runs (`bench.gpu_smoke_verdict.smoke_runs`):
the adaptive controller, static k = K and the kill switch (k = 0) at `--concurrency`,
static K at concurrency 1 for the greedy check, the same without a drafter, and a
tool-calling check on each engine (requests with tools and `tool_choice=auto`, streamed
and not).

Prints per engine what it runs (K and the step rule from `/metrics`; eager or graphs,
graph mode, capture sizes and capture time from vLLM's start-up log; the batch-depth
rule and the FULL-graph widths per batch size from `spec-gateway plan`), per run the
output tokens/s against no drafter, the share of steps that replayed a FULL CUDA graph
and the depths the steps verified, per class the requests, mean k and acceptance
length, and the tool calls. Exit status 1, with one `FAIL` line each, on settings the
plan refuses, an engine that did not start, an error, a stream without a finish
reason, greedy text at concurrency 1 that differs from the no-drafter engine's (at any
concurrency with `--batch-invariant`), or a tool call that did not come back as one.

`--dry` runs the same script on the CPU build against the embedded model (or the tiny
test model where it is not built): the script itself is tested in CI.

    python -m bench.gpu_smoke --model meta-llama/Llama-3.1-8B-Instruct \\
        --drafter yuhuili/EAGLE3-LLaMA3.1-Instruct-8B
    python -m bench.gpu_smoke --dry --per-family 1 --max-tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.families import (
    FAMILIES,
    SAMPLED_FAMILY,
    WEATHER_TOOL,
    Prompt,
    fit_pool,
    load_pool,
)
from bench.gateway_proc import (
    BENCH_KEY,
    REPO,
    GatewayConfig,
    GatewayProcess,
    ModelPaths,
    model_paths,
    start_gateway,
    write_flags,
)
from bench.gpu_smoke_facts import (
    Samples,
    build_info,
    delta,
    graph_steps,
    log_facts,
    parse_metrics,
    plan_facts,
    step_depths,
)
from bench.gpu_smoke_verdict import (
    ENGINES,
    SPECULATIVE,
    Run,
    RunResult,
    SmokeRecord,
    ToolExpectation,
    failures,
    notes,
    report,
    smoke_runs,
)
from bench.replay import request_kwargs
from bench.workload import WorkItem

#: The gateway polls its flags file; a run starts after this (`bench.runner`).
FLAG_SETTLE_S = 1.5
CUDA_VLLM = "0.33.0"
#: Tokens a tool-check answer may take: a call to an offered tool with short
#: arguments fits (the embedded model's are about 40), so none is cut mid-call.
TOOL_MAX_TOKENS = 64
#: Tool-family prompts in the tool check, whatever `--per-family`: the embedded model
#: calls a tool on some of its own, not on each.
TOOL_PROMPTS = 4
#: The one tool prompt a capable model cannot answer without calling the tool.
WEATHER_PROMPT = Prompt(
    "tool_call",
    messages=[{"role": "user", "content": "What is the weather in Paris right now?"}],
    tools=[WEATHER_TOOL],
)


def context_length(target: Path) -> int:
    """The engine's context: `SPECGW_ENGINE_MAX_MODEL_LEN` where the operator sets it
    (the gateways inherit the environment), else the model's own, as vLLM derives it."""
    given = os.environ.get("SPECGW_ENGINE_MAX_MODEL_LEN")
    if given:
        return int(given)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(target)).get_text_config()
    return int(getattr(config, "max_position_embeddings", 0) or 2048)


def work_items(per_family: int, max_tokens: int, seed: int, target: Path) -> list[WorkItem]:
    """The benchmark's families (and its sampled chat), `per_family` prompts each; a
    prompt that cannot fit with its completion is left out, as `make bench` leaves it."""
    pool, _ = fit_pool(load_pool(per_family, seed)[0], target, context_length(target), max_tokens)
    names = [*FAMILIES, SAMPLED_FAMILY]
    prompts = [(name, p) for name in names for p in pool.get(name, [])[:per_family]]
    return [
        WorkItem(i, 0, "smoke", family, prompt, max_tokens)
        for i, (family, prompt) in enumerate(prompts)
    ]


def tool_items(prompts: list[Prompt]) -> list[WorkItem]:
    """The weather prompt and those of `prompts` that end on the user's turn (a call is
    due), each sent streamed (even index) and not (odd)."""
    due = [WEATHER_PROMPT, *(p for p in prompts if _call_due(p))]
    return [
        WorkItem(2 * n + s, 0, "tools", "tool_call", prompt, TOOL_MAX_TOKENS)
        for n, prompt in enumerate(due)
        for s in (0, 1)
    ]


def _call_due(prompt: Prompt) -> bool:
    return bool(prompt.tools and prompt.messages and prompt.messages[-1]["role"] == "user")


async def send(client: openai.AsyncOpenAI, item: WorkItem, model: str, run: Run) -> SmokeRecord:
    """One request; its text, tool calls, finish reason and the gateway's speculation."""
    rec = SmokeRecord(run.label, item.index, item.family, not item.prompt.extra.get("temperature"))
    kwargs = request_kwargs(item, model)
    if run.kind == "tools":
        rec.offered = tuple(t["function"]["name"] for t in item.prompt.tools or [])
        rec.streamed = item.index % 2 == 0
        kwargs["tool_choice"] = "auto"
        if not rec.streamed:
            del kwargs["stream"], kwargs["stream_options"]
    try:
        api = client.chat.completions if item.prompt.is_chat else client.completions
        answer = await api.create(**kwargs)
        if rec.streamed:
            calls: dict[int, list[str]] = {}
            async for chunk in answer:
                _take_chunk(rec, chunk, calls)
            rec.tool_calls = [(name, args) for name, args in calls.values()]
        else:
            _take_message(rec, answer)
    except openai.OpenAIError as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]
    return rec


def _take_chunk(rec: SmokeRecord, chunk: Any, calls: dict[int, list[str]]) -> None:
    for choice in getattr(chunk, "choices", None) or []:
        delta = getattr(choice, "delta", None)
        text = getattr(delta, "content", None) if delta is not None else choice.text
        rec.content += text or ""
        for call in getattr(delta, "tool_calls", None) or []:
            name_args = calls.setdefault(int(call.index or 0), ["", ""])
            function = getattr(call, "function", None)
            name_args[0] += getattr(function, "name", None) or ""
            name_args[1] += getattr(function, "arguments", None) or ""
        rec.finish_reason = choice.finish_reason or rec.finish_reason
    _take_usage(rec, chunk)


def _take_message(rec: SmokeRecord, completion: Any) -> None:
    choice = completion.choices[0]
    rec.content = choice.message.content or ""
    rec.tool_calls = [
        (c.function.name, c.function.arguments or "") for c in choice.message.tool_calls or []
    ]
    rec.finish_reason = choice.finish_reason
    _take_usage(rec, completion)


def _take_usage(rec: SmokeRecord, answer: Any) -> None:
    usage = getattr(answer, "usage", None)
    if usage is not None:
        rec.output_tokens = int(usage.completion_tokens or 0)
    # The gateway's speculation report: its decision, and vLLM's block with the counts.
    extra = getattr(answer, "model_extra", None) or {}
    spec = extra.get("speculation")
    if isinstance(spec, dict):
        rec.gw_class = str(spec.get("class"))
        rec.k = int(spec.get("k", -1))
    counts = (extra.get("metrics") or {}).get("speculative_decoding")
    if isinstance(counts, dict):
        rec.acceptance_length = float(counts.get("mean_acceptance_length", 1.0))


async def metrics(gw: GatewayProcess) -> Samples:
    """The gateway's `/metrics` now (the engine's step counts, its build labels)."""
    async with httpx.AsyncClient(timeout=10) as http:
        return parse_metrics((await http.get(f"{gw.base_url}/metrics")).text)


async def run_pass(
    gw: GatewayProcess, run: Run, items: list[WorkItem], timeout_s: float
) -> RunResult:
    """All items through `run.concurrency` clients; its wall time and step counts."""
    write_flags(gw.flags_dir, run.flags)
    await asyncio.sleep(FLAG_SETTLE_S)
    client = openai.AsyncOpenAI(
        base_url=f"{gw.base_url}/v1", api_key=BENCH_KEY, timeout=timeout_s, max_retries=0
    )
    queue: asyncio.Queue[WorkItem] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)
    result = RunResult(run, 0.0)

    async def worker() -> None:
        while not queue.empty():
            result.records.append(await send(client, queue.get_nowait(), gw.model, run))

    before = await metrics(gw)
    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker() for _ in range(run.concurrency)))
    finally:
        await client.close()
    result.wall_s = time.perf_counter() - start
    after = await metrics(gw)
    result.graph_steps = delta(graph_steps(after), graph_steps(before))
    result.step_depths = delta(step_depths(after), step_depths(before)) or {}
    result.records.sort(key=lambda r: r.index)
    return result


def engine_env(args: argparse.Namespace) -> dict[str, str]:
    """What both gateways add to the environment: vLLM's per-step CUDA-graph stats on
    (for a gateway that exports them), batch-invariant kernels when asked for."""
    extra = json.loads(os.environ.get("SPECGW_ENGINE_EXTRA_ARGS") or "{}")
    env = {"SPECGW_ENGINE_EXTRA_ARGS": json.dumps({"cudagraph_metrics": True, **extra})}
    env["SPECGW_LOG_LEVEL"] = os.environ.get("SPECGW_LOG_LEVEL", "info")
    if args.batch_invariant:
        env["VLLM_BATCH_INVARIANT"] = "1"
    return env


def startup_plan(config: GatewayConfig, models: ModelPaths) -> tuple[dict[str, str], list[str]]:
    """`spec-gateway plan` for the engine `start_gateway` is about to start, with its
    settings: (its batch-depth rule and FULL-graph widths here, a refusal as a failure)."""
    cmd = [sys.executable, "-m", "gateway.cli", "plan", "--model", str(models.target)]
    if config.drafter:
        cmd += ["--drafter", str(models.drafter)]
    cmd += ["--engine.max-depth", str(config.max_depth)]
    env = {**os.environ, **config.env}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    return plan_facts(config.name, done.returncode, done.stdout, done.stderr)


async def on_engine(
    engine: str, args: argparse.Namespace, models: ModelPaths, workdir: Path, items: list[WorkItem]
) -> tuple[list[RunResult], dict[str, str], list[str]]:
    """Start one gateway, run its passes, stop it: (results, what it runs, failures)."""
    spec = engine == SPECULATIVE
    config = GatewayConfig(
        engine, spec, args.max_depth, default_k=3 if spec else 0, env=engine_env(args)
    )
    planned, refused = startup_plan(config, models)
    try:
        gw = start_gateway(config, models, workdir, timeout_s=args.start_timeout)
    except RuntimeError as exc:
        print(str(exc)[-3000:])
        why = f"{engine} engine did not start: {_why(str(exc))} (logs in {workdir})"
        return [], {}, [*refused, why]
    results = []
    try:
        facts = planned | build_info(await metrics(gw))
        facts |= log_facts(gw.log_path.read_text(errors="replace"))
        # First requests pay one-off costs (compilation, lazy kernels): not in a run.
        warm = Run("warm-up", engine, args.concurrency)
        await run_pass(gw, warm, items[: args.concurrency], args.timeout)
        greedy = [i for i in items if not i.prompt.extra.get("temperature")]
        tools = tool_items(load_pool(TOOL_PROMPTS, args.seed)[0].get("tool_call", []))
        for run in (r for r in smoke_runs(args.max_depth, args.concurrency) if r.engine == engine):
            chosen = {"families": items, "greedy": greedy, "tools": tools}[run.kind]
            results.append(await run_pass(gw, run, chosen, args.timeout))
    finally:
        gw.stop_all()  # the next engine needs the GPU memory this one holds
    return results, facts, refused


def _why(failure: str) -> str:
    """`start_gateway`'s first line and the log's last one (the exception, mostly)."""
    lines = [line.strip() for line in failure.splitlines() if line.strip()]
    return " ".join(lines[:1] + lines[-1:] if len(lines) > 1 else lines)[:300]


def tool_expectation(args: argparse.Namespace, models: ModelPaths) -> tuple[ToolExpectation, str]:
    """How many tool requests must come back as calls, and why."""
    if not args.dry:
        return "every", "a real model: every request with tools must call one"
    if os.environ.get("SPECGW_ENGINE_BACKEND") == "fake":
        return "none", "the fake backend calls tools only when told to"
    if models.source != "embedded default model":
        return "none", "random weights call no tool"
    return "any", "the 3.4 M-parameter model calls a tool on some of its own prompts"


def _models(args: argparse.Namespace, workdir: Path) -> ModelPaths:
    if args.dry:
        return model_paths(workdir / "tiny")
    if not args.model or not args.drafter:
        raise SystemExit("gpu-smoke: --model and --drafter are required (or --dry)")
    from engine.vllm.compat import installed_vllm_version

    if installed_vllm_version() != CUDA_VLLM:
        raise SystemExit(f"gpu-smoke: needs vllm {CUDA_VLLM} (make gpu-smoke installs it)")
    return ModelPaths(Path(args.model), Path(args.drafter), "given")


def _check_batch_invariant() -> None:
    """`--batch-invariant` needs vLLM's flag (`vllm.envs`, read by its kernels)."""
    import vllm.envs

    if "VLLM_BATCH_INVARIANT" not in vllm.envs.environment_variables:
        raise SystemExit("gpu-smoke: --batch-invariant: this vLLM has no VLLM_BATCH_INVARIANT")


async def smoke(args: argparse.Namespace, workdir: Path) -> int:
    models = _models(args, workdir)
    if args.batch_invariant:
        _check_batch_invariant()
    expect, why = tool_expectation(args, models)
    print(f"gpu-smoke: target {models.target}, drafter {models.drafter} ({models.source})")
    print(f"gpu-smoke: tool calls expected: {expect} ({why})")
    items = work_items(args.per_family, args.max_tokens, args.seed, models.target)
    results: list[RunResult] = []
    facts: dict[str, dict[str, str]] = {}
    problems: list[str] = []
    for engine in ENGINES:
        done, facts[engine], failed = await on_engine(engine, args, models, workdir, items)
        results += done
        problems += failed
    print(report(results, facts))
    problems += failures(results, expect, args.batch_invariant)
    (workdir / "gpu_smoke.json").write_text(
        json.dumps(
            {
                "engines": facts,
                "runs": [{**asdict(r.run), "wall_s": r.wall_s} for r in results],
                "records": [asdict(rec) for r in results for rec in r.records],
            },
            indent=1,
        )
    )
    for note in notes(results, args.batch_invariant):
        print(f"note {note}")
    for problem in problems:
        print(f"FAIL {problem}")
    runs = len(results)
    verdict = f"FAILED: {len(problems)} failures" if problems else "ok"
    print(f"gpu-smoke: {verdict} ({len(items)} requests, {runs} runs on {len(ENGINES)} engines)")
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
    parser.add_argument(
        "--batch-invariant",
        action="store_true",
        help="VLLM_BATCH_INVARIANT=1 on both engines, and greedy text compared at "
        "--concurrency too (not only at 1). vLLM then swaps kernels and may run breakable "
        "graphs without torch.compile: the tokens/s are not production figures.",
    )
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
