"""A real gateway process on a loopback port, driven with the official `openai` client.

The session's shared processes (`gateway`, `shared_gateway`) are in tests/gateway_fixtures.py."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai

from gateway.auth import digest
from gateway.config.catalogue import env_names
from tests.models import model_pair

USER_KEY = "sk-test-user"
ADMIN_KEY = "sk-test-admin"
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class GatewayProcess:
    base_url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    #: What the start-up's polls saw once the port was bound: (`/ready`'s phase, `/health`'s
    #: status), one pair a second until ready.
    startup: tuple[tuple[str, int], ...] = ()

    def client(self, key: str = USER_KEY, **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=key, **kwargs)  # type: ignore[arg-type]

    def http(self, key: str | None = USER_KEY) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.base_url, headers=headers, timeout=120)

    def engine_requests(self) -> int:
        """Requests the engine itself holds (running + waiting), from /ready's detail."""
        with self.http(None) as http:
            detail = http.get("/ready").json()["detail"]
        return int(detail["engine_running"]) + int(detail["engine_waiting"])


def model_args() -> list[str]:
    models = model_pair()
    return ["--model", str(models.target), "--drafter", str(models.drafter)]


#: The start-up calibration a test gateway runs unless its test sets one: batch 1 only.
#: The gateway's own default on the CPU engine (1, 2, 4, 8, 16) takes minutes of a start
#: (its log's `step costs calibrated in`), batch 1 a fraction of it. Which batches the
#: default picks is `calibration_batches`' (tests/gateway/test_calibration.py).
CALIBRATE_BATCHES = env_names(("control", "calibrate_batches"))[0]
TEST_CALIBRATION = {CALIBRATE_BATCHES: "[1]"}
#: For a test whose gateway's speculation depths do not matter (faults, limits, the
#: nothing-lost contract, cluster state): no calibration, the cost model's prior.
NO_CALIBRATION = {CALIBRATE_BATCHES: "[]"}
#: The session gateway's: a few batch sizes, each timed by the engine's step clock
#: (`test_step_costs_are_calibrated_before_ready`).
SESSION_CALIBRATION = (1, 2, 4)


def start_gateway(
    tmp: Path, extra_env: dict[str, str] | None = None, extra_args: list[str] | None = None
) -> GatewayProcess:
    """A ready gateway on a free port. `free_port` can only hand out a port that was free
    a moment ago: another process (an engine's own sockets among them) may take it before
    the gateway binds, so a start that fails on "address already in use" is tried again on
    a new port (in a full suite, with engines starting beside it, the race does happen)."""
    for attempt in range(3):
        try:
            return _start_gateway(tmp, extra_env, extra_args)
        except PortTakenError:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class PortTakenError(RuntimeError):
    """The gateway could not bind the port `free_port` had found free."""


def _start_gateway(
    tmp: Path, extra_env: dict[str, str] | None, extra_args: list[str] | None
) -> GatewayProcess:
    port = free_port()
    env = dict(os.environ)
    env.update(
        {
            "SPECGW_API_KEYS": digest(USER_KEY),
            "SPECGW_ADMIN_KEYS": digest(ADMIN_KEY),
            "SPECGW_ENGINE_KV_CACHE_GIB": "1",
            "SPECGW_STREAM_IDLE_TIMEOUT_S": "30",
        }
    )
    env.update(TEST_CALIBRATION)
    env.update(extra_env or {})
    log_path = tmp / f"gateway-{port}.log"
    cmd = [
        sys.executable,
        "-m",
        "gateway.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *model_args(),
        *(extra_args or []),
    ]
    with log_path.open("wb") as log:
        # A process group of its own, so that a kill takes its engine core and worker too
        # (`_kill`); killed alone, the gateway leaves them loading the host. Not a
        # session of its own: under the kernel's autogroup scheduling a new session is a
        # new CPU group, which on a busy host gets its fair share as one group, not as
        # its threads, and the gateway starved beside its engine.
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, process_group=0
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    seen: list[tuple[str, int]] = []
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _kill(proc)  # what it started, if anything
            text = log_path.read_text()
            error = PortTakenError if "address already in use" in text else RuntimeError
            raise error(f"gateway exited early:\n{text[-4000:]}")
        try:
            ready, health = probe_phase(base)
        except httpx.HTTPError:
            pass
        else:
            seen.append((str(ready["phase"]), health))
            if ready["ready"]:
                return GatewayProcess(base, proc, log_path, tuple(seen))
        time.sleep(1)
    _kill(proc)
    raise RuntimeError(f"gateway not ready in time:\n{log_path.read_text()[-4000:]}")


def probe_phase(base_url: str) -> tuple[dict[str, object], int]:
    """`/ready`'s body and `/health`'s status code, as a startup and a liveness probe read
    them."""
    ready = httpx.get(f"{base_url}/ready", timeout=2).json()
    return ready, httpx.get(f"{base_url}/health", timeout=2).status_code


def stop_gateway(gw: GatewayProcess) -> None:
    """SIGTERM, a minute to drain and exit, then whatever of its group is left goes."""
    gw.process.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        gw.process.wait(60)
    _kill(gw.process)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the gateway's process group: the gateway, vLLM's EngineCore and its worker."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


def start_replicas(tmp: Path, env: dict[str, str], n: int = 2) -> list[GatewayProcess]:
    """`n` gateway processes with the same settings (replicas of one deployment when
    `env` names one Redis), started one after the other: each embeds its own engine,
    and two engines starting at once would compete for the cores."""
    started: list[GatewayProcess] = []
    try:
        for _ in range(n):
            started.append(start_gateway(tmp, env))
    except BaseException:
        stop_gateways(started)
        raise
    return started


def stop_gateways(gateways: list[GatewayProcess]) -> None:
    for gw in gateways:
        stop_gateway(gw)


class ReusableGateway:
    """One gateway process for a module's tests that may end it: each test gets the
    running process while it is up and ready, else a fresh one with the same settings.
    A test that kills its engine core and waits for the in-process restart, or wedges it
    and lets it go, hands the next one a ready process; one that ends the process (a
    SIGTERM) runs last in its module, or the next test pays for a start."""

    def __init__(
        self,
        tmp: Path,
        extra_env: dict[str, str] | None = None,
        extra_args: list[str] | None = None,
    ) -> None:
        self.tmp, self.extra_env, self.extra_args = tmp, extra_env, extra_args
        self._current: GatewayProcess | None = None

    def get(self) -> GatewayProcess:
        current = self._current
        if current is not None and current.process.poll() is None and _ready(current):
            return current
        self.close()
        self._current = start_gateway(self.tmp, self.extra_env, self.extra_args)
        return self._current

    def close(self) -> None:
        if self._current is not None:
            stop_gateway(self._current)
            self._current = None


def _ready(gw: GatewayProcess) -> bool:
    try:
        return httpx.get(f"{gw.base_url}/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(predicate: Callable[..., object], timeout_s: float) -> float:
    """Poll `predicate` until it holds; the seconds that took (fails after `timeout_s`)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.05)
    raise AssertionError(f"condition not met within {timeout_s} s")
