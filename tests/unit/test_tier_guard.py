"""The unit tier refuses to start an engine core or a server process, and a test's
real-clock sleep (tests/tier_guard.py)."""

from __future__ import annotations

import asyncio
import multiprocessing
import subprocess
import sys
import time

import pytest

from gateway.clock import MONOTONIC, wait_for
from tests import tier_guard
from tests.clock import until, until_sync

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


async def test_a_real_clock_sleep_in_a_test_is_refused() -> None:
    with pytest.raises(tier_guard.TierViolation, match=r"slept 0\.01 s on the real clock"):
        await asyncio.sleep(0.01)


def test_a_blocking_sleep_in_a_test_is_refused() -> None:
    with pytest.raises(tier_guard.TierViolation, match=r"test_tier_guard\.py:\d+"):
        time.sleep(0.01)


async def test_a_yield_and_the_polls_are_allowed() -> None:
    await asyncio.sleep(0)
    assert await until(lambda: True) >= 0.0
    ticks = iter(range(3))
    assert await until(lambda: next(ticks) == 2, timeout_s=5.0) >= 0.0
    assert until_sync(lambda: True) >= 0.0


async def test_a_librarys_own_sleep_is_not_the_tests() -> None:
    """Library and gateway code may sleep: the guard judges the caller's file (here the
    thread pool's worker calls `time.sleep`)."""
    await wait_for(MONOTONIC, asyncio.to_thread(time.sleep, 0.001), 5)
