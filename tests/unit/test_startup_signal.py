"""The port is bound before the engine starts; a SIGTERM or SIGINT during start-up cuts the
start-up short; one after it starts the drain; a start-up that fails ends the server fatal.

`DrainingServer` on the fake backend, in a thread of its own (uvicorn installs signal
handlers only in the main thread, so the test calls `handle_exit` as the handler
would). The fake engine's steps are slowed so that start-up calibration takes some
seconds, as it does on a real engine; the real process is checked in
tests/engine/test_startup_sigterm.py.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import httpx
import pytest
from fastapi import FastAPI

from engine.fake import FakeEngineConfig, StepTimeModel
from engine.fake_backend import FakeBackend
from engine.settings import EngineSettings
from gateway.app import create_app
from gateway.control.settings import ControllerSettings
from gateway.runtime import Runtime, runtime_factory
from gateway.server import DrainingServer, server_config
from gateway.settings import GatewaySettings
from tests.clock import until_sync
from tests.unit.conftest import QUICK_START, gateway_settings

#: Calibration at three batch sizes on 20 ms steps: some seconds, as on a real engine.
SLOW_CALIBRATION = ControllerSettings(calibrate_batches=[1, 2, 4])
SLOW_STEPS = FakeEngineConfig(step_time=StepTimeModel(base_s=0.02))
#: How long the server may take to exit after the signal (the fake engine stops at once).
EXIT_BOUND_S = 3.0


@dataclass
class ServerThread:
    """A `DrainingServer` serving in a thread; `unwound` is set once the runtime's context
    (the engine's among it) has exited."""

    app: FastAPI
    server: DrainingServer
    thread: threading.Thread
    unwound: threading.Event = field(default_factory=threading.Event)

    @property
    def base_url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.base_url}{path}", timeout=5)

    def signal(self, sig: int) -> float:
        """Deliver `sig` as uvicorn's handler would; the seconds until the server ended."""
        sent = time.monotonic()
        self.server.handle_exit(sig, None)
        self.thread.join(EXIT_BOUND_S + 5)
        assert not self.thread.is_alive(), "the server did not exit"
        return time.monotonic() - sent


def serve_in_thread(
    controller: ControllerSettings,
    engine: FakeEngineConfig,
    port: int = 0,
    fail: Exception | None = None,
) -> ServerThread:
    """`fail`: raised by the runtime factory once its engine has started."""
    fake = FakeBackend(engine)
    factory = runtime_factory(EngineSettings(backend="fake"), controller, backend=fake)
    unwound = threading.Event()

    @asynccontextmanager
    async def tracked(settings: GatewaySettings) -> AsyncIterator[Runtime]:
        try:
            async with factory(settings) as runtime:
                if fail is not None:
                    raise fail
                yield runtime
        finally:
            unwound.set()

    settings = gateway_settings(port=port, drain_timeout_s=1.0)
    app = create_app(settings, tracked)
    server = DrainingServer(server_config(app, settings), app)
    thread = threading.Thread(target=lambda: asyncio.run(server.serve()), daemon=True)
    thread.start()
    return ServerThread(app, server, thread, unwound)


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    until_sync(predicate, timeout_s, what)


def messages(caplog: pytest.LogCaptureFixture, level: int = logging.INFO) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= level]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_calibration_ends_start_up_at_once(
    caplog: pytest.LogCaptureFixture, sig: signal.Signals
) -> None:
    caplog.set_level(logging.INFO)
    served = serve_in_thread(SLOW_CALIBRATION, SLOW_STEPS)
    wait_until(
        lambda: any("calibrating step costs" in m for m in messages(caplog)), 30, "calibration"
    )
    took = served.signal(sig)

    assert took < EXIT_BOUND_S
    assert served.unwound.is_set()
    assert served.server.started  # the port was bound before the engine started
    assert served.app.state.runtime is None  # never published
    assert served.server.interrupted_by == sig
    assert not served.server.fatal
    said = messages(caplog)
    assert [m for m in said if "start-up interrupted" in m] == [
        f"start-up interrupted by {sig.name}: the engine is shut down; exiting"
    ]
    assert not any("step costs calibrated" in m for m in said)
    assert messages(caplog, logging.WARNING) == []


def test_sigterm_after_start_up_drains_as_before(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    served = serve_in_thread(QUICK_START, FakeEngineConfig())
    wait_until(lambda: served.app.state.runtime is not None, 30, "start-up")
    runtime = served.app.state.runtime

    served.signal(signal.SIGTERM)

    assert runtime.drain_task is not None
    assert runtime.drain_task.done()
    assert served.unwound.is_set()
    assert served.server.interrupted_by is None
    assert not any("start-up interrupted" in m for m in messages(caplog))
    assert messages(caplog, logging.ERROR) == []


def test_a_port_taken_ends_the_server_before_the_engine_starts() -> None:
    """uvicorn exits where it cannot bind, before any engine is started (a port taken is
    found in a second, not after minutes of model load)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        served = serve_in_thread(QUICK_START, FakeEngineConfig(), taken.getsockname()[1])
        served.thread.join(10)
    assert not served.thread.is_alive()
    assert not served.server.started
    assert not served.unwound.is_set()  # the runtime factory was never entered


def test_the_probes_answer_with_the_phase_while_the_engine_calibrates(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    served = serve_in_thread(SLOW_CALIBRATION, SLOW_STEPS)
    wait_until(lambda: served.app.state.phases.phase == "calibrating", 30, "calibration")

    health = served.get("/health")
    ready = served.get("/ready")
    metrics = served.get("/metrics").text
    chat = httpx.post(f"{served.base_url}/v1/chat/completions", json={}, timeout=5)

    assert (health.status_code, health.json()) == (200, {"status": "ok", "phase": "calibrating"})
    assert ready.status_code == 503
    body = ready.json()
    assert (body["ready"], body["phase"]) == (False, "calibrating")
    assert body["progress"]["unit"] == "rounds"
    assert 0 <= body["progress"]["done"] < body["progress"]["total"]
    assert 'specgw_phase{phase="calibrating"} 1.0' in metrics
    assert 'specgw_phase{phase="ready"} 0.0' in metrics
    assert chat.status_code in (401, 503)  # no key: refused before the runtime is asked
    wait_until(lambda: served.app.state.runtime is not None, 60, "start-up")
    assert served.get("/ready").json()["phase"] == "ready"
    said = [m for m in messages(caplog) if m.startswith("phase ")]
    assert [m.split(" after ")[0] for m in said] == [
        "phase loading: starting the engine",
        "phase loading -> calibrating",
        "phase calibrating -> ready",
    ]
    served.signal(signal.SIGTERM)


def test_a_start_up_that_fails_stops_the_server_fatal(capfd: pytest.CaptureFixture[str]) -> None:
    served = serve_in_thread(QUICK_START, FakeEngineConfig(), fail=RuntimeError("no GPU"))
    served.thread.join(EXIT_BOUND_S + 5)

    assert not served.thread.is_alive()
    assert served.server.fatal  # `spec-gateway serve` exits 3
    assert served.unwound.is_set()  # the engine that had started is shut down
    said = capfd.readouterr().err  # uvicorn's own handler: its logger does not propagate
    assert said.count("Application startup failed. Exiting.") == 1
    assert "RuntimeError: no GPU" in said
