"""SIGTERM to `spec-gateway serve` during start-up calibration ends it within seconds.

uvicorn acts on a signal only after the app's lifespan start-up has finished, so a pod
terminated while the gateway calibrates waited for the calibration (18 s and more on
the embedded model) before its drain began. `gateway.server.DrainingServer` cancels the
start-up instead: the engine's core and workers shut down, one INFO line says so, and
the process exits as after a drain (uvicorn re-raises the signal).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gateway.auth import digest
from tests.gateway.conftest import REPO, USER_KEY, free_port, model_args

pytestmark = pytest.mark.engine

#: From SIGTERM to the process's exit: the engine's shutdown takes a second or two.
EXIT_BOUND_S = 10.0
INTERRUPTED = "start-up interrupted by SIGTERM: the engine is shut down; exiting"


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie has exited, awaiting its reaper)."""
    alive = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_sigterm_during_calibration_exits_promptly_with_no_process_left(tmp_path: Path) -> None:
    log_path = tmp_path / "gateway.log"
    env = {
        **os.environ,
        "SPECGW_API_KEYS": digest(USER_KEY),
        "SPECGW_ENGINE_KV_CACHE_GIB": "1",
    }
    cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1"]
    cmd += ["--port", str(free_port()), *model_args()]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    children: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 300
        while "calibrating step costs" not in log_path.read_text():
            assert proc.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, "calibration did not start"
            time.sleep(0.1)
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children, "the engine started no process of its own"

        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        status = proc.wait(EXIT_BOUND_S + 30)
        took = time.monotonic() - sent
        text = log_path.read_text()

        assert took < EXIT_BOUND_S, f"exited {took:.1f} s after SIGTERM:\n{text[-4000:]}"
        assert status in (0, -signal.SIGTERM), text[-4000:]
        assert INTERRUPTED in text
        assert "step costs calibrated" not in text
        assert "Uvicorn running on" in text  # the port is bound before the engine starts
        assert "Traceback" not in text, text[-4000:]
        gone_by = time.monotonic() + 10
        alive = _alive(children)
        while alive and time.monotonic() < gone_by:
            time.sleep(0.2)
            alive = _alive(alive)
        assert not alive, [(c.pid, c.name()) for c in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
        for child in _alive(children):  # orphans (reparented) where the shutdown failed
            child.kill()
