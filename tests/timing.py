"""Wall-clock bounds in tests: time the code, not the interpreter's garbage collector."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the collector for a timed section.

    Under the full suite a worker process also holds torch and vLLM. `tests/conftest.py`
    freezes what collection imported, but what the tests made since is still tracked,
    and a full collection over it lands on whichever call happens to be timed. The tests
    that bound a wait in wall time bound waiting on Redis or a queue, which this leaves
    measured.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
