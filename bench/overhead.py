"""Gateway overhead: added latency over an in-process engine call, and requests/s per core.

Both figures use the gateway on a no-op engine (`bench.noop_engine`), so the
engine's own time (and its noise, which on a CPU is milliseconds) is out of
the measurement:

- added latency: each streamed request through the gateway (HTTP, auth,
  admission, planner, vLLM's serving layer, SSE relay, outcome tap) minus the
  median time of the same request made in-process straight to the engine
  client; p50 / p99 over requests sent one at a time.
- ceiling: many concurrent streams for a fixed time; requests/s per core =
  completed requests / CPU seconds the gateway process used (user + system,
  from /proc), with the gateway's process pinned to one core.

Latency is timed with two clients, both reading every byte to `[DONE]`: a raw
HTTP/1.1 socket client (one keep-alive connection, no parsing beyond finding
the end of the chunked body), whose own cost is a few microseconds, and
`httpx` streaming lines, whose own cost on a small CPU is about 1.7 ms a request
(it is most of the bare-uvicorn floor's time). The added-latency checks use the
raw client, so what they bill to the gateway is the gateway's; the `httpx`
figures stay in the table. The same request is also timed in-process through
vLLM's OpenAI serving layer alone (`bench.noop_engine.time_serving`), which
splits the added time into what serving this request with vLLM costs anyway
and what the gateway adds on top (HTTP, auth, admission, planning, relay).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench.engines import cpu_seconds
from bench.gateway_proc import (
    BENCH_ADMIN_KEY,
    BENCH_KEY,
    REPO,
    free_port,
    stop_process,
    wait_ready,
)
from bench.noop_engine import OVERHEAD_MAX_TOKENS, overhead_body
from bench.stats import percentile
from gateway.auth import digest


def _raw_request(host: str, model: str) -> bytes:
    body = json.dumps(overhead_body(model)).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n"
        f"authorization: Bearer {BENCH_KEY}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _raw_latency(base: str, model: str, n: int) -> list[float]:
    """Seconds per streamed request on one keep-alive socket, to the end of the body.

    The end of a chunked SSE body is its last data chunk's "\\n\\n" then the
    zero-size chunk; a reply that is not a 200 stream ending in `[DONE]` fails.
    """
    host, port = base.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    request = _raw_request(host, model)
    out: list[float] = []
    try:
        for i in range(n + 20):  # the first 20: warm-up
            t0 = time.perf_counter()
            writer.write(request)
            buf = b""
            while not buf.endswith(b"\n\n\r\n0\r\n\r\n"):
                data = await reader.read(65536)
                if not data:
                    raise RuntimeError(f"connection closed mid-reply: {buf[-300:]!r}")
                buf += data
            elapsed = time.perf_counter() - t0
            if not buf.startswith(b"HTTP/1.1 200") or b"data: [DONE]" not in buf:
                raise RuntimeError(f"not a complete stream: {buf[:300]!r}")
            if i >= 20:
                out.append(elapsed)
    finally:
        writer.close()
    return out


async def _one(client: httpx.AsyncClient, model: str) -> float:
    t0 = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=overhead_body(model)) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line == "data: [DONE]":
                break
    return time.perf_counter() - t0


async def _latency(base: str, model: str, n: int) -> list[float]:
    headers = {"authorization": f"Bearer {BENCH_KEY}"}
    async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
        for _ in range(20):  # warm-up: connections, caches
            await _one(client, model)
        return [await _one(client, model) for _ in range(n)]


async def _ceiling(
    base: str, model: str, pid: int, concurrency: int, seconds: float
) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {BENCH_KEY}"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(
        base_url=base, headers=headers, timeout=60, limits=limits
    ) as client:
        done = 0
        errors = 0
        stop = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal done, errors
            while time.perf_counter() < stop:
                try:
                    await _one(client, model)
                    done += 1
                except httpx.HTTPError:
                    errors += 1

        cpu0, client0, t0 = cpu_seconds({pid}), time.process_time(), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        cpu = cpu_seconds({pid}) - cpu0
        client_cpu = time.process_time() - client0
    return {
        "concurrency": concurrency,
        "requests": done,
        "errors": errors,
        "wall_s": wall,
        "requests_per_s": done / wall,
        "gateway_cpu_s": cpu,
        "requests_per_cpu_s": done / cpu if cpu > 0 else None,
        "client_cpu_s": client_cpu,
    }


def _start(cmd: list[str], log: Path, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [*cmd, "--port", str(port)], cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, f"{base}/ready", log, name=cmd[2])
    except RuntimeError:
        stop_process(proc, 60)
        raise
    return proc, base


def _measure(
    proc: subprocess.Popen[bytes], base: str, latency_n: int, ceiling_s: float
) -> tuple[list[float], list[float], list[dict[str, Any]]]:
    """(one-at-a-time latencies with the raw client, the same with httpx, ceilings at
    concurrency 8 and 32), the server pinned to one core."""
    cores = sorted(os.sched_getaffinity(0))
    try:
        if len(cores) > 1:  # the server on one core, the load generator on the others
            os.sched_setaffinity(proc.pid, {cores[-1]})
            os.sched_setaffinity(0, set(cores[:-1]))
        auth = {"authorization": f"Bearer {BENCH_KEY}"}
        model = httpx.get(f"{base}/v1/models", headers=auth).json()["data"][0]["id"]
        raw = asyncio.run(_raw_latency(base, model, latency_n))
        latencies = asyncio.run(_latency(base, model, latency_n))
        ceilings = [asyncio.run(_ceiling(base, model, proc.pid, c, ceiling_s)) for c in (8, 32)]
    finally:
        os.sched_setaffinity(0, set(cores))
    return raw, latencies, ceilings


def _ms(values: list[float], q: float) -> float:
    return 1000 * (percentile(values, q) or 0.0)


def measure_overhead(
    target: Path, out_dir: Path, latency_n: int = 300, ceiling_s: float = 10.0
) -> dict[str, Any]:
    """Measure the no-op gateway and the bare SSE floor; writes and returns `overhead.json`."""
    direct_path = out_dir / "overhead-direct.json"
    env = dict(os.environ)
    env.update(
        {
            "SPECGW_API_KEYS": digest(BENCH_KEY),
            "SPECGW_ADMIN_KEYS": digest(BENCH_ADMIN_KEY),
            "SPECGW_ENGINE_KV_CACHE_GIB": "1",
            "SPECGW_MAX_RUNNING": "1024",
            "SPECGW_MAX_QUEUED": "1024",
        }
    )
    cmd = [sys.executable, "-m", "bench.noop_engine", "--model", str(target)]
    cmd += ["--direct-out", str(direct_path), "--direct-n", str(max(latency_n, 100))]
    proc, base = _start(cmd, out_dir / "gateway-noop.log", env)
    try:
        gateway, gateway_httpx, ceilings = _measure(proc, base, latency_n, ceiling_s)
    finally:
        stop_process(proc, 60)
    proc, base = _start([sys.executable, "-m", "bench.sse_floor"], out_dir / "sse-floor.log", env)
    try:
        floor, floor_httpx, floor_ceilings = _measure(proc, base, latency_n, ceiling_s)
    finally:
        stop_process(proc, 60)
    timed = json.loads(direct_path.read_text())
    direct, serving = timed["engine"], timed["serving"]
    base_s = statistics.median(direct)
    added = [g - base_s for g in gateway]
    added_httpx = [g - base_s for g in gateway_httpx]
    best = max(ceilings, key=lambda c: c["requests_per_cpu_s"] or 0)
    result = {
        "request": f"chat, streamed, {OVERHEAD_MAX_TOKENS} tokens",
        "client": "raw HTTP/1.1 socket (httpx figures: *_httpx_*)",
        "direct_p50_ms": _ms(direct, 50),
        "direct_p99_ms": _ms(direct, 99),
        "serving_p50_ms": _ms(serving, 50),
        "serving_p99_ms": _ms(serving, 99),
        "gateway_p50_ms": _ms(gateway, 50),
        "gateway_p99_ms": _ms(gateway, 99),
        "added_p50_ms": _ms(added, 50),
        "added_p99_ms": _ms(added, 99),
        "floor_p50_ms": _ms(floor, 50),
        "floor_p99_ms": _ms(floor, 99),
        "gateway_httpx_p50_ms": _ms(gateway_httpx, 50),
        "gateway_httpx_p99_ms": _ms(gateway_httpx, 99),
        "added_httpx_p50_ms": _ms(added_httpx, 50),
        "added_httpx_p99_ms": _ms(added_httpx, 99),
        "floor_httpx_p50_ms": _ms(floor_httpx, 50),
        "floor_httpx_p99_ms": _ms(floor_httpx, 99),
        "latency_requests": len(gateway),
        "ceiling": ceilings,
        "floor_ceiling": floor_ceilings,
        "requests_per_s_per_core": best["requests_per_cpu_s"],
    }
    (out_dir / "overhead.json").write_text(json.dumps(result, indent=1))
    return result
