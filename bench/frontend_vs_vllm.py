"""The gateway against vLLM's own OpenAI server, on one engine configuration.

    python -m bench.frontend_vs_vllm [--repeats 2] [--ttft-requests 40]
        [--load-requests 64] [--concurrency 16] [--interleaved 0] [--rounds 1]
        [--gap-ms 300] [--dry]

Two servers, never both up at once, alternated A B B A (`--repeats` turns each):

* `gateway`: `spec-gateway serve` on the embedded model and drafter (`bench.gateway_proc`),
  its flags pinned to k = K for every request (`controller-mode` static, `pin-k` K);
* `vllm`: `python -m vllm.entrypoints.openai.api_server` (what `vllm serve` runs) with
  the engine arguments the gateway builds (`engine.vllm.engine.engine_args`: the same
  model, drafter, speculative config, scheduler and worker classes, block size,
  max_num_seqs ...), every one that differs from vLLM's default passed as its flag.
  Its requests carry no depth, which the depth-capping scheduler reads as K.

So both engines draft K in every step and only the front end differs. Each turn starts
its server, sends untimed warm-up requests, then (a) TTFT: `--ttft-requests` streamed
chat requests one at a time, time to the first content chunk at the client; (b)
saturation: `--load-requests` requests from `--concurrency` closed-loop clients, with
the front-end process's CPU seconds (psutil, user + system of that process only, not
the engine core and workers it starts) over the phase divided by the requests.
Prompts: the benchmark's chat families, the same few in the same order on both, each
sent once untimed first, so that every timed request is a prefix-cache hit on either
server and the TTFT tail is not the long-context family's cold prefill. `--dry` prints
both command lines and exits.

`--interleaved N` adds a finer TTFT reading: both servers up at once but only one ever
serving, N prompts each sent to both one after the other (gateway first on even prompts,
vLLM first on odd ones), `--gap-ms` of idle time before every request so that the
other engine's OpenMP threads have stopped spinning (GOMP_SPINCOUNT, KMP_BLOCKTIME 200
ms) before the next one runs. Each prompt is a pair taken within a second, so the host's
drift (on a shared host, 10 ms of a turn's TTFT over minutes) cancels; the summary gives
both servers' p50 and p99, the median per-pair difference and a paired bootstrap 95 %
interval of each, and each front end's CPU per request over the phase (one request at a
time, not at saturation). `--rounds R` repeats that phase on R fresh starts of both
servers, the gateway started first in even rounds: a fresh start moves the difference by
more than one phase resolves (over a millisecond between starts with `--rounds 4`), so
only the rounds pooled, with their spread, say what the front end adds. `--repeats 0`
runs the interleaved rounds alone.

`--client vllm-bench` measures instead with vLLM's own `vllm bench serve` against the
gateway's defaults and `vllm serve` at `--vllm-depths`, one pass per `--concurrency`
(`bench.vllm_bench_client`; written to `--out`).
A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.stats import bootstrap_interval, percentile

VLLM_SERVER = ("-m", "vllm.entrypoints.openai.api_server")
#: The issue's bounds on the gateway over vLLM's server.
TARGET_TTFT_P50_MS = 0.5
TARGET_TTFT_P99_MS = 2.0
TARGET_CPU_RATIO = 1.2


def cli_flags(changed: dict[str, Any]) -> list[str]:
    """vLLM CLI flags for engine arguments: `--name-with-dashes value`; booleans as
    `--x` / `--no-x`, lists as several values, dicts as JSON; None is left out."""
    flags: list[str] = []
    for name, value in changed.items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            flags.append(flag if value else "--no-" + name.replace("_", "-"))
        elif isinstance(value, dict):
            flags += [flag, json.dumps(value, sort_keys=True)]
        elif isinstance(value, list | tuple):
            flags += [flag, *(str(v) for v in value)]
        else:
            flags += [flag, str(value)]
    return flags


def changed_engine_args(args: Any, default: Any) -> dict[str, Any]:
    """The fields of an `AsyncEngineArgs` that differ from `default`'s, in field order."""
    return {
        f.name: getattr(args, f.name)
        for f in dataclasses.fields(args)
        if getattr(args, f.name) != getattr(default, f.name)
    }


def vllm_command(settings: Any, port: int) -> list[str]:
    """The `vllm serve` equivalent of the gateway's engine for these settings."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from engine.vllm.engine_args import engine_args

    changed = changed_engine_args(engine_args(settings), AsyncEngineArgs())
    model = str(changed.pop("model"))
    head = [sys.executable, *VLLM_SERVER, "--model", model]
    return [*head, "--host", "127.0.0.1", "--port", str(port), *cli_flags(changed)]


def abba_order(alternations: int, names: list[str]) -> list[str]:
    """A B B A A B ...: each pair of turns runs both, in alternating order."""
    order: list[str] = []
    for i in range(alternations):
        order += names if i % 2 == 0 else names[::-1]
    return order


@dataclass
class Turn:
    """What one turn of one server measured."""

    ttfts_s: list[float] = field(default_factory=list)
    cpu_s_per_request: float = 0.0
    requests_per_s: float = 0.0

    def p(self, q: float) -> float:
        return float(percentile(self.ttfts_s, q) or 0.0)


def summary_rows(turns: dict[str, list[Turn]]) -> list[str]:
    """The table: per server the median [min-max] over turns of each figure."""

    def cell(values: list[float], scale: float = 1e3) -> str:
        med, lo, hi = (scale * f(values) for f in (statistics.median, min, max))
        return f"{med:.2f} [{lo:.2f}-{hi:.2f}]"

    rows = [
        f"{'server':<8} {'TTFT p50 ms':>22} {'TTFT p99 ms':>22} {'CPU ms/req':>20} {'req/s':>8}"
    ]
    for name, seen in turns.items():
        rows.append(
            f"{name:<8} {cell([t.p(50) for t in seen]):>22} {cell([t.p(99) for t in seen]):>22}"
            f" {cell([t.cpu_s_per_request for t in seen]):>20}"
            f" {statistics.median(t.requests_per_s for t in seen):>8.1f}"
        )
    return rows


def verdict(turns: dict[str, list[Turn]]) -> list[str]:
    """The gateway against the targets, on medians over turns."""
    gw, vl = turns["gateway"], turns["vllm"]

    def med(seen: list[Turn], figure: str) -> float:
        if figure == "cpu":
            return statistics.median(t.cpu_s_per_request for t in seen)
        return statistics.median(t.p(50 if figure == "p50" else 99) for t in seen)

    d50 = 1e3 * (med(gw, "p50") - med(vl, "p50"))
    d99 = 1e3 * (med(gw, "p99") - med(vl, "p99"))
    ratio = med(gw, "cpu") / med(vl, "cpu") if med(vl, "cpu") > 0 else float("inf")
    return [
        f"TTFT p50 gateway - vllm: {d50:+.2f} ms (target <= {TARGET_TTFT_P50_MS})",
        f"TTFT p99 gateway - vllm: {d99:+.2f} ms (target <= {TARGET_TTFT_P99_MS})",
        f"CPU per request gateway / vllm: {ratio:.2f}x (target <= {TARGET_CPU_RATIO}x)",
    ]


def paired_verdict(turns: dict[str, list[Turn]]) -> list[str]:
    """The gateway against the targets, per pair of neighbouring turns: the i-th turn of
    each server are neighbours in the A B B A order, so each pair's difference leaves out
    the host's drift between pairs, which the medians over turns keep."""
    pairs = list(zip(turns["gateway"], turns["vllm"], strict=False))
    if not pairs:
        return []

    def spread(values: list[float], unit: str, fmt: str) -> str:
        med, lo, hi = statistics.median(values), min(values), max(values)
        return f"{med:{fmt}}{unit} [{lo:{fmt}} to {hi:{fmt}}]"

    d50 = [1e3 * (g.p(50) - v.p(50)) for g, v in pairs]
    d99 = [1e3 * (g.p(99) - v.p(99)) for g, v in pairs]
    ratios = [
        g.cpu_s_per_request / v.cpu_s_per_request for g, v in pairs if v.cpu_s_per_request > 0
    ]
    lines = [
        f"paired by neighbouring turns ({len(pairs)} pairs), median [min to max]:",
        f"TTFT p50 gateway - vllm: {spread(d50, ' ms', '+.2f')} (target <= {TARGET_TTFT_P50_MS})",
        f"TTFT p99 gateway - vllm: {spread(d99, ' ms', '+.2f')} (target <= {TARGET_TTFT_P99_MS})",
    ]
    if ratios:
        lines.append(
            f"CPU per request gateway / vllm: {spread(ratios, 'x', '.2f')} "
            f"(target <= {TARGET_CPU_RATIO}x)"
        )
    return lines


@dataclass
class Pairs:
    """TTFTs of the same prompts on both servers, taken one after the other."""

    gateway_s: list[float] = field(default_factory=list)
    vllm_s: list[float] = field(default_factory=list)
    cpu_s_per_request: dict[str, float] = field(default_factory=dict)


def _median_difference_ms(pairs: list[tuple[float, float]]) -> float:
    """Median over prompts of gateway - vLLM, in ms."""
    return 1e3 * statistics.median(g - v for g, v in pairs)


def pairs_summary(pairs: Pairs) -> list[str]:
    """Both servers' TTFT p50 / p99 and the gateway's excess over vLLM, with paired
    bootstrap 95 % intervals: p50 and p99 of each server's own TTFTs, their
    difference, and the median of the per-prompt differences."""
    both = list(zip(pairs.gateway_s, pairs.vllm_s, strict=True))
    if not both:
        return []

    def p(values: list[float], q: float) -> float:
        return float(percentile(values, q) or 0.0)

    def excess(q: float) -> Any:
        return lambda ps: 1e3 * (p([g for g, _ in ps], q) - p([v for _, v in ps], q))

    lines = [f"interleaved: {len(both)} prompts, each on both servers one after the other"]
    for name, seen in (("gateway", pairs.gateway_s), ("vllm", pairs.vllm_s)):
        cpu = pairs.cpu_s_per_request.get(name)
        cpu_cell = f", front-end CPU {1e3 * cpu:.2f} ms/request" if cpu is not None else ""
        lines.append(
            f"{name:<8} TTFT p50 {1e3 * p(seen, 50):.2f} ms, p99 {1e3 * p(seen, 99):.2f} ms"
            + cpu_cell
        )
    for label, stat, target in (
        ("TTFT p50 gateway - vllm", excess(50), TARGET_TTFT_P50_MS),
        ("TTFT p99 gateway - vllm", excess(99), TARGET_TTFT_P99_MS),
        ("median per-prompt difference", _median_difference_ms, None),
    ):
        lo, hi = bootstrap_interval(both, stat)
        bound = f" (target <= {target})" if target is not None else ""
        lines.append(f"{label}: {stat(both):+.2f} ms [95 % {lo:+.2f} to {hi:+.2f}]{bound}")
    return lines


async def interleaved(servers: dict[str, Server], args: argparse.Namespace) -> Pairs:
    """Each prompt on both servers, one request at a time, the first server alternating."""
    import httpx
    import psutil

    convs = chat_messages(args.interleaved)
    fronts = {n: psutil.Process(s.process.pid) for n, s in servers.items()}
    seen: dict[str, list[float]] = {n: [] for n in servers}
    cpu = dict.fromkeys(servers, 0.0)
    async with httpx.AsyncClient(timeout=120) as client:
        for server in servers.values():
            await warm(client, server, convs, args.max_tokens)
        names = list(servers)
        for i, msgs in enumerate(convs):
            for name in names if i % 2 == 0 else names[::-1]:
                await asyncio.sleep(args.gap_ms / 1e3)
                before = sum(fronts[name].cpu_times()[:2])
                seen[name].append(await ttft(client, servers[name], msgs, args.max_tokens))
                cpu[name] += sum(fronts[name].cpu_times()[:2]) - before
    count = max(len(convs), 1)
    return Pairs(seen["gateway"], seen["vllm"], {n: c / count for n, c in cpu.items()})


def interleaved_round(args: argparse.Namespace, settings: Any, workdir: Path, index: int) -> Pairs:
    """Start both servers (the gateway first in even rounds), run the interleaved phase,
    stop both."""
    started: dict[str, Server] = {}
    try:
        for name in ("gateway", "vllm") if index % 2 == 0 else ("vllm", "gateway"):
            started[name] = start_server(name, args.max_depth, settings, workdir)
        pairs = asyncio.run(interleaved({n: started[n] for n in ("gateway", "vllm")}, args))
    finally:
        for server in started.values():
            server.stop()
    print(f"round {index + 1}:", *pairs_summary(pairs)[1:], sep="\n  ", flush=True)
    return pairs


def rounds_summary(rounds: list[Pairs]) -> list[str]:
    """Per round the median per-prompt difference; then the rounds pooled."""
    diffs = [
        _median_difference_ms(list(zip(r.gateway_s, r.vllm_s, strict=True)))
        for r in rounds
        if r.gateway_s
    ]
    if not diffs:
        return []
    pooled = Pairs(
        [t for r in rounds for t in r.gateway_s],
        [t for r in rounds for t in r.vllm_s],
        {n: statistics.mean(r.cpu_s_per_request[n] for r in rounds) for n in ("gateway", "vllm")},
    )
    cells = ", ".join(f"{d:+.2f}" for d in diffs)
    return [
        f"\n{len(rounds)} rounds, each a fresh start of both servers",
        f"median per-prompt difference by round: {cells} ms "
        f"(median {statistics.median(diffs):+.2f})",
        *pairs_summary(pooled),
    ]


def chat_messages(count: int) -> list[list[dict[str, str]]]:
    """Chat requests from the benchmark's families (a plain prompt as one user turn)."""
    from bench.families import load_pool

    pool, _ = load_pool(per_family=2, seed=0)
    convs = []
    for prompts in pool.values():
        for p in prompts:
            msgs = [
                {"role": m["role"], "content": str(m.get("content") or "")}
                for m in p.messages or []
            ]
            convs.append(msgs or [{"role": "user", "content": p.prompt or ""}])
    return [convs[i % len(convs)] for i in range(count)]


@dataclass
class Server:
    """One front end up on a loopback port: its process and how to talk to it."""

    name: str
    base_url: str
    process: subprocess.Popen[bytes]
    model: str
    headers: dict[str, str]
    stop: Any


def start_vllm(settings: Any, workdir: Path) -> Server:
    from bench.gateway_proc import free_port, stop_process, wait_ready

    port = free_port()
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(settings.kv_cache_gib)}
    log = (workdir / f"vllm-{port}.log").open("wb")
    proc = subprocess.Popen(vllm_command(settings, port), env=env, stdout=log, stderr=log)
    base = f"http://127.0.0.1:{port}"
    wait_ready(proc, f"{base}/health", workdir / f"vllm-{port}.log", name="vllm")
    stop = functools.partial(stop_process, proc)
    return Server("vllm", base, proc, settings.served_names()[0], {}, stop)


def start_gateway(max_depth: int, workdir: Path) -> Server:
    import httpx

    from bench.gateway_proc import BENCH_KEY, GatewayConfig, model_paths, write_flags
    from bench.gateway_proc import start_gateway as start

    models = model_paths(workdir / "tiny")
    gw = start(GatewayConfig("frontend", True, max_depth, max_depth), models, workdir)
    write_flags(gw.flags_dir, {"controller-mode": "static", "pin-k": max_depth})
    headers = {"authorization": f"Bearer {BENCH_KEY}"}
    body = {"model": gw.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    for _ in range(40):  # the gateway watches flags.json: wait until the pin applies
        resp = httpx.post(f"{gw.base_url}/v1/chat/completions", json=body, headers=headers)
        if resp.headers.get("x-specgw-k") == str(max_depth):
            return Server("gateway", gw.base_url, gw.process, gw.model, headers, gw.stop)
        time.sleep(0.5)
    gw.stop()
    raise RuntimeError("the gateway did not apply pin-k")


def start_server(name: str, max_depth: int, settings: Any, workdir: Path) -> Server:
    """`gateway` or `vllm`, up and ready."""
    if name == "gateway":
        return start_gateway(max_depth, workdir)
    return start_vllm(settings, workdir)


async def ttft(
    client: Any, server: Server, messages: list[dict[str, str]], max_tokens: int
) -> float:
    """Seconds from sending a streamed chat request to its first content chunk."""
    body = {
        "model": server.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    start = time.perf_counter()
    first = 0.0
    url = f"{server.base_url}/v1/chat/completions"
    async with client.stream("POST", url, json=body, headers=server.headers) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if first or not line.startswith("data: {"):
                continue
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                first = time.perf_counter() - start
    if not first:
        raise RuntimeError("stream ended without content")
    return first


async def warm(
    client: Any, server: Server, convs: list[list[dict[str, str]]], max_tokens: int
) -> None:
    """Each distinct prompt once, untimed: every prompt cached alike on both servers
    before timing."""
    for msgs in {json.dumps(c): c for c in convs}.values():
        await ttft(client, server, msgs, max_tokens)


async def measure(server: Server, args: argparse.Namespace) -> Turn:
    import httpx
    import psutil

    front = psutil.Process(server.process.pid)
    turn = Turn()
    convs = chat_messages(max(args.ttft_requests, args.load_requests))
    async with httpx.AsyncClient(timeout=120) as client:
        await warm(client, server, convs, args.max_tokens)
        for msgs in convs[: args.ttft_requests]:
            turn.ttfts_s.append(await ttft(client, server, msgs, args.max_tokens))
        queue = list(convs[: args.load_requests])

        async def worker() -> None:
            while queue:
                await ttft(client, server, queue.pop(), args.max_tokens)

        cpu0, wall0 = sum(front.cpu_times()[:2]), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency[-1])))
        cpu1, wall1 = sum(front.cpu_times()[:2]), time.perf_counter()
    turn.cpu_s_per_request = (cpu1 - cpu0) / args.load_requests
    turn.requests_per_s = args.load_requests / (wall1 - wall0)
    return turn


def run(args: argparse.Namespace) -> None:
    from bench.gateway_proc import model_paths
    from engine.settings import EngineSettings

    workdir = Path(tempfile.mkdtemp(prefix="specgw-frontend-"))
    models = model_paths(workdir / "tiny")
    print(f"model: {models.source} ({models.target})")
    settings = EngineSettings(
        model=models.target, drafter=models.drafter, max_depth=args.max_depth, kv_cache_gib=1
    )
    if args.dry:
        print("vllm:", " ".join(vllm_command(settings, 8000)))
        print(
            "gateway: python -m gateway.cli serve --model",
            models.target,
            "--drafter",
            models.drafter,
            "--max-depth",
            args.max_depth,
            "(flags: static, pin-k K)",
        )
        return
    if args.interleaved > 0:
        rounds = [interleaved_round(args, settings, workdir, i) for i in range(args.rounds)]
        print("\n".join(rounds_summary(rounds)), flush=True)
    turns: dict[str, list[Turn]] = {"gateway": [], "vllm": []}
    for name in abba_order(args.repeats, list(turns)):
        server = start_server(name, args.max_depth, settings, workdir)
        try:
            turns[name].append(asyncio.run(measure(server, args)))
        finally:
            server.stop()
        last = turns[name][-1]
        print(
            f"{name}: TTFT p50 {1e3 * last.p(50):.2f} ms, p99 {1e3 * last.p(99):.2f} ms, "
            f"CPU {1e3 * last.cpu_s_per_request:.2f} ms/request",
            flush=True,
        )
    if not args.repeats:
        return
    print(
        f"\n{args.repeats} turns each (A B B A), median [min-max] over turns; "
        f"saturation: {args.concurrency[-1]} clients, {args.load_requests} requests"
    )
    print("\n".join(summary_rows(turns)))
    print("\n".join(verdict(turns)))
    print("\n".join(paired_verdict(turns)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="turns per server")
    parser.add_argument("--ttft-requests", type=int, default=40)
    parser.add_argument("--load-requests", type=int, default=64)
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=[16],
        help="saturation clients (the last one given); with --client vllm-bench, each a pass",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=16, help="per reply (vllm-bench: 128 unless given)"
    )
    parser.add_argument(
        "--client",
        choices=("httpx", "vllm-bench"),
        default="httpx",
        help="vllm-bench: `vllm bench serve` against the gateway's defaults and `vllm serve` "
        "at --vllm-depths (bench.vllm_bench_client)",
    )
    parser.add_argument(
        "--vllm-depths", type=int, nargs="+", default=[0], help="vllm-bench: 0 is no drafter"
    )
    parser.add_argument(
        "--prompts", type=int, nargs="+", help="vllm-bench: prompts per --concurrency pass"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/vllm_bench.json"))
    parser.add_argument("--max-depth", type=int, default=4)
    parser.add_argument(
        "--interleaved", type=int, default=0, help="prompts sent to both servers in turn"
    )
    parser.add_argument(
        "--rounds", type=int, default=1, help="fresh starts of both servers, interleaved"
    )
    parser.add_argument("--gap-ms", type=float, default=300, help="idle before each request")
    parser.add_argument("--dry", action="store_true", help="print both commands and exit")
    args = parser.parse_args()
    if args.client == "vllm-bench":
        from bench.vllm_bench_client import run_vllm_bench

        if "--max-tokens" not in sys.argv:
            args.max_tokens = 128
        args.prompts = args.prompts or [max(16, 4 * c) for c in args.concurrency]
        if len(args.prompts) != len(args.concurrency):
            parser.error("--prompts: one count per --concurrency")
        run_vllm_bench(args)
        return
    run(args)


if __name__ == "__main__":
    main()
