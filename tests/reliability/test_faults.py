"""Faults on a real gateway process: a wedged engine, a dead engine core, SIGTERM.

Each test drives a real `spec-gateway serve` (real vLLM CPU engine) over a
loopback socket and checks the nothing-lost contract: every request ends in a
real finish or an explicit error, and readiness tells the truth. The tests run in
file order on one process while it comes back ready (`ReusableGateway`); the SIGTERM,
which ends it, comes last.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from itertools import groupby

import httpx
import psutil
import pytest

from tests.gateway.conftest import (
    NO_CALIBRATION,
    GatewayProcess,
    ReusableGateway,
    probe_phase,
)

pytestmark = [pytest.mark.engine, pytest.mark.slow]

LONG = {
    "model": "specgw-default",
    "messages": [{"role": "user", "content": "Tell me about the json module."}],
    "max_tokens": 1500,
    "ignore_eos": True,
    "stream": True,
}


def engine_core(gw: GatewayProcess) -> psutil.Process:
    for child in psutil.Process(gw.process.pid).children(recursive=True):
        if "EngineCore" in " ".join(child.cmdline()) or "EngineCore" in child.name():
            return child
    raise AssertionError("no engine core process found")


def ready(gw: GatewayProcess) -> bool:
    try:
        return httpx.get(f"{gw.base_url}/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def runs(seen: Sequence[tuple[str, int]]) -> str:
    """`loading/200 x34, ready/200 x1`: what the polls saw, run by run."""
    counted = ((key, len(list(group))) for key, group in groupby(seen))
    return ", ".join(f"{phase}/{code} x{n}" for (phase, code), n in counted)


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if predicate():
            return time.monotonic() - started
        time.sleep(0.1)
    raise AssertionError(f"condition not met within {timeout_s} s")


class StreamProbe:
    """Reads one streaming request in a thread and records how it ended."""

    def __init__(self, gw: GatewayProcess, body: dict[str, object] = LONG) -> None:
        self.events: list[str] = []
        self.status: int | None = None
        self.error: BaseException | None = None
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(gw, body), daemon=True)
        self._thread.start()

    def _run(self, gw: GatewayProcess, body: dict[str, object]) -> None:
        try:
            with gw.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
                self.status = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        self.events.append(line[6:])
                        self.started.set()
        except BaseException as exc:  # the probe records, the test asserts
            self.error = exc
            self.started.set()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "stream did not end"

    @property
    def ended_with_error_event(self) -> bool:
        return bool(self.events) and "error" in json.loads(self.events[-1])

    @property
    def ended_with_done(self) -> bool:
        return bool(self.events) and self.events[-1] == "[DONE]"


@pytest.fixture(scope="module")
def fault_gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReusableGateway]:
    env = {"SPECGW_ENGINE_STALL_BOUND_S": "4", "SPECGW_DRAIN_TIMEOUT_S": "3", **NO_CALIBRATION}
    gateways = ReusableGateway(tmp_path_factory.mktemp("faults"), env)
    yield gateways
    gateways.close()


@pytest.fixture
def gateway_proc(fault_gateways: ReusableGateway) -> GatewayProcess:
    """A ready process: the one the test before left ready (a wedged core let go, a killed
    one replaced in process), else a fresh start. The SIGTERM test, which ends it, is last."""
    return fault_gateways.get()


def test_wedged_engine_is_not_ready_within_10s(gateway_proc: GatewayProcess) -> None:
    probe = StreamProbe(gateway_proc)
    assert probe.started.wait(60)
    core = engine_core(gateway_proc)
    core.send_signal(signal.SIGSTOP)
    try:
        took = wait_until(lambda: not ready(gateway_proc), 10)
        assert took <= 10
        health = httpx.get(f"{gateway_proc.base_url}/health", timeout=2)
        assert health.status_code == 200  # alive, only wedged: no restart storm
    finally:
        core.send_signal(signal.SIGCONT)
    wait_until(lambda: ready(gateway_proc), 30)
    probe.join(120)
    assert probe.ended_with_done or probe.ended_with_error_event


def test_dead_engine_core_fails_inflight_and_restarts(gateway_proc: GatewayProcess) -> None:
    """Also what the probes see: the port answers while the model loads (`/ready` 503 in
    phase `loading`), and through the in-process restart (`restarting`), `/health` 200 all
    the while, so neither a startup probe nor liveness kills a replica that is loading."""
    startup = gateway_proc.startup
    assert startup[0] == ("loading", 200), startup
    assert startup[-1] == ("ready", 200), startup
    assert {code for _, code in startup} == {200}, startup
    probe = StreamProbe(gateway_proc)
    assert probe.started.wait(60)
    engine_core(gateway_proc).kill()
    probe.join(30)
    assert probe.ended_with_error_event, probe.events[-3:]
    assert not probe.ended_with_done
    wait_until(lambda: not ready(gateway_proc), 10)
    restart: list[tuple[str, int]] = []

    def back() -> bool:
        try:
            body, health = probe_phase(gateway_proc.base_url)
        except httpx.HTTPError as exc:  # the port must answer all through the restart
            restart.append((type(exc).__name__, 0))
            return False
        restart.append((str(body["phase"]), health))
        return bool(body["ready"])

    wait_until(back, 180)
    assert ("restarting", 200) in restart, restart
    assert restart[-1] == ("ready", 200), restart
    assert {code for _, code in restart} == {200}, restart
    print(f"start-up: {runs(startup)}; restart: {runs(restart)}")
    with gateway_proc.http() as http:
        body = {**LONG, "stream": False, "max_tokens": 8}
        assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_sigterm_drains_then_ends_leftovers_with_an_error(gateway_proc: GatewayProcess) -> None:
    probe = StreamProbe(gateway_proc, {**LONG, "max_tokens": 2000})
    assert probe.started.wait(60)
    os.kill(gateway_proc.process.pid, signal.SIGTERM)
    time.sleep(0.5)
    try:
        refused = httpx.post(f"{gateway_proc.base_url}/v1/chat/completions", json=LONG, timeout=5)
    except httpx.ConnectError:
        pass  # the listener is closed: new connections are refused outright
    else:
        assert refused.status_code == 503
        assert refused.headers["retry-after"]
    probe.join(30)
    # 2000 tokens take longer than the 3 s drain: the leftover ends with an error event.
    assert probe.ended_with_error_event, probe.events[-2:]
    # uvicorn re-raises the captured SIGTERM after its graceful shutdown.
    assert gateway_proc.process.wait(60) in (0, -signal.SIGTERM)
