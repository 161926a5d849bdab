"""SIGTERM to a process holding an engine shuts vLLM down: no orphaned core or workers,
and no error logged for it.

Python's default SIGTERM kills the process without running `finally`, and vLLM's
engine core and its worker are separate processes that then keep running (2.7 GB
each time a benchmark was `pkill`ed). `engine.vllm.sigterm` turns SIGTERM into a
cancellation while the engine's context is open.

vLLM 0.32's `AsyncLLM.shutdown` stops the core before it cancels its output handler,
which then logged "AsyncLLM output_handler failed." with an `EngineDeadError` traceback
at ERROR on every clean stop (vllm-project/vllm#48745); operators page on those, so
`VLLMEngine.shutdown` cancels the handler first.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass

import psutil
import pytest

pytestmark = pytest.mark.engine

HOLDER = textwrap.dedent(
    """
    import asyncio, os, sys, time
    import psutil
    from engine.vllm.engine import VLLMEngine
    from tests.engine.engines import engine_settings

    def slow_to_return(core):
        # AsyncLLM.shutdown runs in a thread; if it is slow to reach its handler cancel,
        # the loop hands the core's EngineDeadError to a handler still running. Which
        # side wins varies from run to run; the pause makes the losing order certain.
        stop = core.shutdown

        def shutdown(timeout=None):
            stop(timeout=timeout)
            time.sleep(0.5)

        core.shutdown = shutdown

    async def main():
        # One warm-up request: the output handler has delivered outputs before the stop.
        settings = engine_settings(max_depth=2).model_copy(update={"warmup_prompts": 1})
        async with VLLMEngine.started(settings) as engine:
            slow_to_return(engine.llm.engine_core)
            me = psutil.Process(os.getpid())
            pids = " ".join(str(p.pid) for p in me.children(recursive=True))
            print(f"children: {pids}", flush=True)
            await asyncio.sleep(600)

    if __name__ == "__main__":
        asyncio.run(main())
    """
)


@dataclass(frozen=True)
class TerminatedHolder:
    """A process that held a started engine, after SIGTERM: its children and its log."""

    children: list[psutil.Process]
    shutdown_log: str


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie has exited, awaiting its reaper)."""
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def engine_dead_lines(log: str) -> list[str]:
    """Lines of a clean shutdown's log that report the engine dead: vLLM's output-handler
    failure and any traceback line naming `EngineDeadError`."""
    return [
        line for line in log.splitlines() if "EngineDeadError" in line or "handler failed" in line
    ]


@pytest.fixture(scope="module")
def terminated_holder() -> Iterator[TerminatedHolder]:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    children: list[psutil.Process] = []
    try:
        assert holder.stdout is not None
        line = ""
        while not line.startswith("children:"):  # vLLM logs to stdout too
            line = holder.stdout.readline()
            assert line, "the holder exited before its engine was up"
        children = [psutil.Process(int(pid)) for pid in line.split()[1:]]
        assert children, "the engine started no process of its own"
        holder.send_signal(signal.SIGTERM)
        shutdown_log, _ = holder.communicate(timeout=60)
        yield TerminatedHolder(children, shutdown_log)
    finally:
        if holder.poll() is None:
            holder.kill()
        for child in children:  # orphans (reparented) where the shutdown failed
            if child.is_running():
                child.kill()


def test_sigterm_shuts_the_engine_core_and_workers_down(
    terminated_holder: TerminatedHolder,
) -> None:
    deadline = time.monotonic() + 30
    alive = _alive(terminated_holder.children)
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = _alive(alive)
    assert not alive, [(c.pid, c.name()) for c in alive]


def test_clean_shutdown_logs_no_engine_dead_error(terminated_holder: TerminatedHolder) -> None:
    assert "[shutdown] MPClient: complete" in terminated_holder.shutdown_log
    assert not engine_dead_lines(terminated_holder.shutdown_log), terminated_holder.shutdown_log
