"""SIGTERM to a process holding an engine shuts vLLM down: no orphaned core or workers.

Python's default SIGTERM kills the process without running `finally`, and vLLM's
engine core and its worker are separate processes that then keep running (2.7 GB
each time a benchmark was `pkill`ed). `engine.vllm.sigterm` turns SIGTERM into a
cancellation while the engine's context is open.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytestmark = pytest.mark.engine

HOLDER = textwrap.dedent(
    """
    import asyncio, os, sys
    import psutil
    from engine.vllm.engine import VLLMEngine
    from tests.engine.engines import engine_settings

    async def main():
        settings = engine_settings(max_depth=2).model_copy(update={"warmup_prompts": 0})
        async with VLLMEngine.started(settings):
            me = psutil.Process(os.getpid())
            pids = " ".join(str(p.pid) for p in me.children(recursive=True))
            print(f"children: {pids}", flush=True)
            await asyncio.sleep(600)

    if __name__ == "__main__":
        asyncio.run(main())
    """
)


def _alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    """Those still running (a zombie has exited, awaiting its reaper)."""
    return [p for p in processes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


def test_sigterm_shuts_the_engine_core_and_workers_down() -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdout=subprocess.PIPE,
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
        holder.wait(timeout=60)
        deadline = time.monotonic() + 30
        alive = _alive(children)
        while alive and time.monotonic() < deadline:
            time.sleep(0.2)
            alive = _alive(alive)
        assert not alive, [(c.pid, c.name()) for c in alive]
    finally:
        if holder.poll() is None:
            holder.kill()
        for child in children:  # orphans (reparented) where the shutdown failed
            if child.is_running():
                child.kill()
