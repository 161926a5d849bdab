"""A real gateway process on a loopback port, started and stopped by the benchmark.

Each engine configuration (with or without a drafter, vLLM's batch-size
schedule) needs its own process; everything else is switched by rewriting the
flagd-format `flags.json` the gateway watches (`SPECGW_FLAGS_DIR`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateway.auth import digest
from gateway.flags.document import FLAGD_SCHEMA

BENCH_KEY = "sk-bench-user"
BENCH_ADMIN_KEY = "sk-bench-admin"
REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class ModelPaths:
    target: Path
    drafter: Path
    source: str


def model_paths(tiny_dir: Path) -> ModelPaths:
    """The embedded default model when built, else a tiny random-weight pair (said so)."""
    try:
        from engine import model_paths as model_paths_module
    except ImportError:
        pass
    else:
        paths = model_paths_module.default_model_paths()
        if paths.exists():
            return ModelPaths(paths.target, paths.eagle31, "embedded default model")
    from tools.model.testing_models import build_tiny_models

    tiny = build_tiny_models(tiny_dir)
    return ModelPaths(tiny.target, tiny.drafter, "tiny random-weight test model")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """What needs its own process: the engine's configuration and the gateway's start flags."""

    name: str
    drafter: bool = True
    max_depth: int = 4
    default_k: int = 3
    env: dict[str, str] = field(default_factory=dict)


def write_flags(flags_dir: Path, values: dict[str, Any]) -> None:
    """Atomically replace `flags.json` (flagd format) with these global values."""
    flags = {
        key: {"state": "ENABLED", "variants": {"default": v}, "defaultVariant": "default"}
        for key, v in values.items()
    }
    tmp = flags_dir / "flags.json.tmp"
    tmp.write_text(json.dumps({"$schema": FLAGD_SCHEMA, "flags": flags}, indent=1))
    tmp.replace(flags_dir / "flags.json")


@dataclass
class GatewayProcess:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    flags_dir: Path
    model: str = "specgw-default"

    def stop(self) -> None:
        stop_process(self.process)

    def stop_all(self, grace_s: float = 30.0) -> None:
        """`stop`, then wait for the processes the gateway started (vLLM's engine core and
        its workers) and kill any still there after `grace_s`: one left running holds the
        GPU memory the next engine on the host needs."""
        left = descendants(self.process.pid)
        self.stop()
        deadline = time.monotonic() + grace_s
        while left and time.monotonic() < deadline:
            time.sleep(0.5)
            left = [pid for pid in left if _running(pid)]
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def descendants(pid: int) -> list[int]:
    """Every process under `pid`, from Linux's `/proc` (none where there is no `/proc`)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _running(pid: int) -> bool:
    """Whether `pid` still runs (a zombie waits only to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _served_model(base_url: str) -> str:
    """The model id to send: the first one `/v1/models` lists."""
    auth = {"authorization": f"Bearer {BENCH_KEY}"}
    resp = httpx.get(f"{base_url}/v1/models", headers=auth, timeout=10)
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


def start_gateway(
    config: GatewayConfig, models: ModelPaths, workdir: Path, timeout_s: float = 600
) -> GatewayProcess:
    """Start `python -m gateway.cli serve` and wait for `/ready`; raise with the log on failure."""
    port = free_port()
    flags_dir = workdir / f"flags-{config.name}"
    flags_dir.mkdir(parents=True, exist_ok=True)
    write_flags(flags_dir, {})
    env = dict(os.environ)
    env.update(
        {
            "SPECGW_API_KEYS": digest(BENCH_KEY),
            "SPECGW_ADMIN_KEYS": digest(BENCH_ADMIN_KEY),
            "SPECGW_FLAGS_DIR": str(flags_dir),
            "SPECGW_ENGINE_KV_CACHE_GIB": env.get("SPECGW_ENGINE_KV_CACHE_GIB", "1"),
            "SPECGW_LOG_LEVEL": env.get("SPECGW_LOG_LEVEL", "warning"),
        }
    )
    env.update(config.env)
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--model", str(models.target)]
    cmd += ["--max-depth", str(config.max_depth), "--default-k", str(config.default_k)]
    if config.drafter:
        cmd += ["--drafter", str(models.drafter)]
    log_path = workdir / f"gateway-{config.name}-{port}.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    gw = GatewayProcess(f"http://127.0.0.1:{port}", proc, log_path, flags_dir)
    try:
        wait_ready(proc, f"{gw.base_url}/ready", log_path, timeout_s, name="gateway")
    except RuntimeError:
        gw.stop()
        raise
    gw.model = _served_model(gw.base_url)
    return gw


def wait_ready(
    proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float = 600, name: str = "server"
) -> None:
    """Poll `url` until it answers 200; raise with the log's tail if `proc` exits first or
    the time runs out (the message's first line names the server: `bench.gpu_smoke`
    reports it)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited early:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{name} not ready in {timeout_s:.0f} s:\n{log.read_text()[-4000:]}")


def stop_process(proc: subprocess.Popen[bytes], grace_s: float = 90) -> None:
    """SIGTERM, then SIGKILL if it has not exited within `grace_s`."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
