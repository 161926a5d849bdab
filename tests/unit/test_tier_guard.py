"""The unit tier refuses to start an engine core or a server process (tests/tier_guard.py)."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest

from tests import tier_guard

pytestmark = pytest.mark.skipif(
    not tier_guard._active, reason="the guard is on only in the unit tier (-m 'not engine')"
)


def test_a_gateway_process_is_refused() -> None:
    with pytest.raises(tier_guard.TierViolation, match="mark the test `engine`"):
        subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port", "0"])


def test_an_engine_core_process_is_refused() -> None:
    core = multiprocessing.get_context("spawn").Process(target=print, name="EngineCore_DP0")
    with pytest.raises(tier_guard.TierViolation, match="vLLM engine core"):
        core.start()


def test_other_processes_run() -> None:
    done = subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True, check=True)
    assert done.stdout.strip() == b"ok"
