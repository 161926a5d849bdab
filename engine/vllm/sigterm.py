"""SIGTERM unwinds a running engine's context instead of killing the process outright.

Python's default SIGTERM action ends the process at once: no `finally` runs, so an
`async with VLLMEngine.started(...)` never shuts vLLM down, and the engine core and
its workers (separate processes, gigabytes of KV cache) outlive their parent (`pkill`
of a benchmark left both running). While SIGTERM still has that default, it cancels
the task that holds the engine instead; the context's `finally` then shuts it down.
A process that handles SIGTERM itself (uvicorn's graceful shutdown) keeps its handler.
"""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def cancelled_on_sigterm() -> Iterator[None]:
    """While inside, SIGTERM cancels the current task (where SIGTERM has its default)."""
    task = asyncio.current_task()
    if (
        task is None
        or threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        yield
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
