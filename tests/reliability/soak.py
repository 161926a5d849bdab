"""Chaos soak: two real gateway replicas on one real Redis, under faults, nothing lost.

`python -m tests.reliability.soak --requests 2000 --concurrency 32` starts
redis-server and two `spec-gateway serve` replicas (real vLLM CPU engines),
sends a seeded mix of chat / completion / tool-call requests, streamed and not,
while it kills one engine core, stops and restarts Redis, disconnects clients
at random points, sends SIGTERM to one replica (and starts a new one), and
keeps a slow reader going. It checks the nothing-lost contract:

* every request ends in exactly one terminal state (see `soak_client`);
* no truncated stream is reported as a success;
* 1 s after the last client left, with traffic paused, no replica's engine
  still runs or queues a request (`/ready` detail `engine_running`/`engine_waiting`);
* every replica is ready again after each fault;
* no prompt text (the soak marker) in any replica's log.

It prints a JSON summary and exits non-zero when any check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from tests.gateway.conftest import USER_KEY, GatewayProcess, start_gateway, stop_gateway
from tests.redis_fixtures import RedisServer
from tests.reliability.soak_client import (
    GOOD,
    SOAK_MARKER,
    Ended,
    plan_request,
    run_request,
    slow_request,
)

ENGINE_RESTART_BOUND_S = 240.0
REQUEST_TIMEOUT_S = 180.0


@dataclass
class SoakConfig:
    requests: int = 2000
    concurrency: int = 32
    replicas: int = 2
    seed: int = 7
    workdir: Path | None = None


@dataclass
class Replica:
    name: str
    gw: GatewayProcess
    accepting: bool = True
    ready: bool = True  # as a load balancer's readiness probe last saw it


@dataclass
class Soak:
    config: SoakConfig
    workdir: Path
    redis: RedisServer
    replicas: list[Replica]
    ended: list[Ended] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    next_index: int = 0
    generation: int = 0

    # -- traffic -------------------------------------------------------------

    def _pick(self, rng: random.Random) -> Replica:
        accepting = [r for r in self.replicas if r.accepting]
        ready = [r for r in accepting if r.ready]
        return rng.choice(ready or accepting or self.replicas)

    async def _send(self, planned: Any, rng: random.Random) -> None:
        replica = self._pick(rng)
        self.in_flight += 1
        try:
            async with _client(replica.gw) as client:
                ended = await run_request(client, replica.name, planned, REQUEST_TIMEOUT_S)
        finally:
            self.in_flight -= 1
        self.ended.append(ended)
        if ended.state == "refused" or ended.status == 503:
            await asyncio.sleep(0.5)  # as a client honouring retry-after would; keeps the budget

    async def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        while True:
            await self.gate.wait()
            if self.next_index >= self.config.requests:
                return
            index = self.next_index
            self.next_index += 1
            await self._send(plan_request(index, rng), rng)

    async def slow_reader(self, stop: asyncio.Event) -> None:
        rng, i = random.Random(self.config.seed + 1), 0
        while not stop.is_set():
            await self.gate.wait()
            await self._send(slow_request(i), rng)
            i += 1

    async def probe_readiness(self, stop: asyncio.Event) -> None:
        """Route like a load balancer: only to replicas whose /ready said yes."""
        while not stop.is_set():
            for replica in list(self.replicas):
                replica.ready = await self.ready(replica) is not None
            await asyncio.sleep(0.5)

    # -- checks --------------------------------------------------------------

    async def ready(self, replica: Replica) -> dict[str, Any] | None:
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                r = await client.get(f"{replica.gw.base_url}/ready")
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None

    async def wait_all_ready(self, fault: str, bound_s: float) -> None:
        started = time.monotonic()
        for replica in self.replicas:
            while await self.ready(replica) is None:
                if time.monotonic() - started > bound_s:
                    self.failures.append(f"{replica.name} not ready {bound_s} s after {fault}")
                    return
                await asyncio.sleep(0.5)
        took = round(time.monotonic() - started, 1)
        self.faults.append({"fault": fault, "ready_again_s": took, "at_request": self.next_index})

    async def checkpoint(self, name: str) -> None:
        """Pause traffic; 1 s after the last client left, no engine holds a request."""
        self.gate.clear()
        while self.in_flight:  # noqa: ASYNC110 - a poll keeps the traffic code free of signalling
            await asyncio.sleep(0.05)
        left = [e.left_at for e in self.ended if e.left_at is not None]
        await asyncio.sleep(max(0.0, (max(left) if left else 0.0) + 1.0 - time.monotonic()))
        row: dict[str, Any] = {"checkpoint": name, "after_requests": len(self.ended)}
        for replica in self.replicas:
            report = await self.ready(replica)
            if report is None:
                self.failures.append(f"{name}: {replica.name} not ready at the checkpoint")
                continue
            detail = report["detail"]
            busy = int(detail["engine_running"]) + int(detail["engine_waiting"])
            row[replica.name] = busy
            if busy:
                self.failures.append(f"{name}: {replica.name} engine still holds {busy} requests")
        self.checkpoints.append(row)
        self.gate.set()

    # -- faults --------------------------------------------------------------

    async def kill_engine_core(self, replica: Replica) -> None:
        core = _engine_core(replica.gw)
        core.kill()
        await asyncio.sleep(1.0)
        await self.wait_all_ready("engine core killed", ENGINE_RESTART_BOUND_S)

    async def redis_outage(self, seconds: float) -> None:
        self.redis.stop()
        await asyncio.sleep(seconds)
        await asyncio.to_thread(self.redis.start)
        await self.wait_all_ready("redis stopped and restarted", 30)

    async def sigterm_and_replace(self, index: int) -> None:
        old = self.replicas[index]
        old.gw.process.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.5)  # traffic still reaches it: 503 draining or refused
        old.accepting = False
        code = await asyncio.to_thread(old.gw.process.wait, 120)
        if code not in (0, -signal.SIGTERM):
            self.failures.append(f"{old.name} exited {code} after SIGTERM")
        self.generation += 1
        gw = await asyncio.to_thread(self._start, f"r{index}.{self.generation}")
        self.replicas[index] = Replica(f"r{index}.{self.generation}", gw)
        await self.wait_all_ready("replica SIGTERM and replaced", 300)

    def _start(self, name: str) -> GatewayProcess:
        workdir = self.workdir / name
        workdir.mkdir(parents=True, exist_ok=True)
        gw = start_gateway(workdir, {"SPECGW_REDIS_URL": self.redis.url, **_soak_env()})
        self.logs.append(gw.log_path)
        return gw


def _soak_env() -> dict[str, str]:
    return {
        "SPECGW_STREAM_IDLE_TIMEOUT_S": "20",
        "SPECGW_DRAIN_TIMEOUT_S": "5",
        "SPECGW_ENGINE_STALL_BOUND_S": "15",
        "SPECGW_QUEUE_TIMEOUT_S": "60",
    }


def _client(gw: GatewayProcess) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=gw.base_url,
        headers={"authorization": f"Bearer {USER_KEY}"},
        timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=5),
        limits=httpx.Limits(max_keepalive_connections=0),
    )


def _engine_core(gw: GatewayProcess) -> psutil.Process:
    for child in psutil.Process(gw.process.pid).children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
            return child
    raise RuntimeError("no engine core process found")


async def _schedule(soak: Soak) -> None:
    """Faults at fixed shares of the request count, each followed by a checkpoint."""
    n = soak.config.requests
    steps = [
        (0.10, "baseline", None),
        (0.20, "engine core killed", lambda: soak.kill_engine_core(soak.replicas[0])),
        (0.40, "redis outage", lambda: soak.redis_outage(3.0)),
        (0.60, "replica SIGTERM", lambda: soak.sigterm_and_replace(len(soak.replicas) - 1)),
    ]
    for share, name, fault in steps:
        while soak.next_index < int(n * share):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        if fault is not None:
            await fault()
        await soak.checkpoint(name)


async def run_soak(config: SoakConfig) -> dict[str, Any]:
    workdir = config.workdir or Path(tempfile.mkdtemp(prefix="specgw-soak-"))
    redis = RedisServer(workdir)
    redis.start()
    soak = Soak(config, workdir, redis, [])
    try:
        gws = await asyncio.gather(
            *(asyncio.to_thread(soak._start, f"r{i}") for i in range(config.replicas))
        )
        soak.replicas = [Replica(f"r{i}", gw) for i, gw in enumerate(gws)]
        started = time.monotonic()
        soak.gate.set()
        stop_slow = asyncio.Event()
        slow = asyncio.ensure_future(soak.slow_reader(stop_slow))
        prober = asyncio.ensure_future(soak.probe_readiness(stop_slow))
        schedule = asyncio.ensure_future(_schedule(soak))
        await asyncio.gather(
            *(soak.worker(config.seed * 1000 + i) for i in range(config.concurrency))
        )
        await schedule
        stop_slow.set()
        await slow
        await prober
        await soak.checkpoint("end")
        elapsed = time.monotonic() - started
    finally:
        for replica in soak.replicas:
            await asyncio.to_thread(stop_gateway, replica.gw)
        redis.stop()
    return _summary(soak, elapsed)


def _summary(soak: Soak, elapsed: float) -> dict[str, Any]:
    states = Counter(e.state for e in soak.ended)
    bad = [e for e in soak.ended if e.state not in GOOD]
    for e in bad[:20]:
        soak.failures.append(f"request {e.index} ({e.kind} on {e.replica}): {e.state} {e.detail}")
    if bad:
        soak.failures.append(f"{len(bad)} requests broke the contract")
    for log in soak.logs:
        if SOAK_MARKER in log.read_text(errors="replace"):
            soak.failures.append(f"prompt text in {log}")
    main = [e for e in soak.ended if e.kind != "slow_stream"]
    slow = [e for e in soak.ended if e.kind == "slow_stream"]
    return {
        "requests": len(main),
        "slow_client_requests": len(slow),
        "slow_client_states": dict(Counter(e.state for e in slow)),
        "elapsed_s": round(elapsed, 1),
        "states": dict(states),
        "kinds": dict(Counter(e.kind for e in soak.ended)),
        "errors": dict(Counter(e.detail for e in soak.ended if e.state.endswith("error"))),
        "faults": soak.faults,
        "checkpoints": soak.checkpoints,
        "logs": [str(p) for p in soak.logs],
        "failures": soak.failures,
        "ok": not soak.failures and len(main) >= soak.config.requests,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", type=Path, help="also write the JSON summary here")
    args = parser.parse_args(argv)
    config = SoakConfig(args.requests, args.concurrency, args.replicas, args.seed)
    summary = asyncio.run(run_soak(config))
    text = json.dumps(summary, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
