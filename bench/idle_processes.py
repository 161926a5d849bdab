"""Whether gateway processes left up idle slow the one being measured (the runner's
interleaving keeps every mode's process up between its turns).

    python -m bench.idle_processes [--cycles 2] [--replays 3] [--idle 4]

One no-drafter gateway replays the benchmark workload at concurrency 4, `--replays`
times alone, then `--replays` times with `--idle` speculative gateways started and
left idle, then stops them; `--cycles` times. Prints output tokens/s of every replay
and the median of each condition. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

import openai

from bench.families import fit_pool, load_pool
from bench.gateway_proc import BENCH_KEY, GatewayConfig, GatewayProcess, model_paths, start_gateway
from bench.replay import replay
from bench.workload import ClosedLoop, WorkItem, build_workload, default_phases


def _tokens_per_s(gw: GatewayProcess, items: list[WorkItem]) -> float:
    async def go() -> float:
        client = openai.AsyncOpenAI(
            base_url=f"{gw.base_url}/v1", api_key=BENCH_KEY, max_retries=0, timeout=300
        )
        try:
            records, wall = await replay(client, items, ClosedLoop(4), gw.model)
        finally:
            await client.close()
        return sum(r.output_tokens for r in records) / wall

    return asyncio.run(go())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument("--replays", type=int, default=3)
    parser.add_argument("--idle", type=int, default=4)
    parser.add_argument("--workdir", type=Path, default=Path("results/idle_processes"))
    args = parser.parse_args()
    from engine.settings import EngineSettings

    models = model_paths(Path(os.environ.get("SPECGW_TEST_MODELS", "/tmp/specgw-tiny")))
    pool, _ = load_pool(per_family=16, seed=1234)
    pool, _ = fit_pool(pool, models.target, EngineSettings().max_model_len, 32)
    items = build_workload(default_phases(12), pool, 1234, 32)
    args.workdir.mkdir(parents=True, exist_ok=True)
    measured = start_gateway(
        GatewayConfig("nospec", drafter=False, default_k=0), models, args.workdir
    )
    results: dict[str, list[float]] = {"alone": [], "with idle": []}
    try:
        _tokens_per_s(measured, items)  # untimed warm-up
        for cycle in range(args.cycles):
            results["alone"] += [_tokens_per_s(measured, items) for _ in range(args.replays)]
            idle = [
                start_gateway(GatewayConfig(f"idle{i}", drafter=True), models, args.workdir)
                for i in range(args.idle)
            ]
            try:
                time.sleep(5)  # past vLLM's 1 s busy-poll after the last request
                results["with idle"] += [
                    _tokens_per_s(measured, items) for _ in range(args.replays)
                ]
            finally:
                for gw in idle:
                    gw.stop()
            print(f"cycle {cycle}:", {k: [round(v) for v in vs] for k, vs in results.items()})
    finally:
        measured.stop()
    for name, values in results.items():
        print(
            f"{name}: median {statistics.median(values):.1f} tokens/s "
            f"({min(values):.0f} to {max(values):.0f}, {len(values)} replays)"
        )


if __name__ == "__main__":
    main()
