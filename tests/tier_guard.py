"""The unit tier's promise, enforced: no vLLM engine and no gateway process starts in it.

Active when the run deselects the `engine` marker (`make unit` is `pytest -m "not
engine"`). A test that starts either anyway fails at that point, with a message that
says to mark it `engine`, instead of quietly making the fast tier slow:

* an engine core: vLLM starts it as a `multiprocessing` process named `EngineCore`
  (`vllm.v1.engine.utils.CoreEngineProcManager`); its start is refused;
* a gateway or vLLM server process: a `subprocess.Popen` of `gateway.cli serve`,
  `spec-gateway serve` or `vllm serve` (seen through the `subprocess.Popen` audit
  event, PEP 578) is refused.

Other processes (redis-server, promtool, helm's renderer) are the unit tier's own.
Importing vLLM is allowed (its protocol models, its scheduler driven step by step).

And no test sleeps on the real clock: a `time.sleep` or `asyncio.sleep` of more than 0 s
called from a file under `tests/` is refused, with a message that says what to do
instead (advance a `gateway.clock.ManualClock`, or wait for the condition with
`tests/clock.py`, whose polls are the one place allowed). `asyncio.sleep(0)` (a yield) is
allowed, and so is every sleep the gateway or a library makes. The few places that
wait on a clock outside the process (Prometheus's scrapes, the slow-Redis proxy) are
named in `REAL_CLOCK`, each with its reason.
`serve --check-config` serves nothing (it validates, prints, exits) and is allowed; a
`serve` that must refuse its settings and exit before it starts anything runs inside
`settings_refusal()`, under the test's timeout.
"""

from __future__ import annotations

import asyncio
import multiprocessing.process
import re
import sys
import time
from collections.abc import Coroutine, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

_ENGINE_DESELECTED = re.compile(r"\bnot\s+engine\b")
_SERVERS = (("gateway.cli", "serve"), ("spec-gateway", "serve"), ("vllm", "serve"))


class TierViolation(RuntimeError):
    """A unit-tier test started an engine or a server process."""


_active = False
_hook_installed = False


def _argv(args: Any) -> list[str]:
    if isinstance(args, str | bytes):
        return str(args).split()
    if isinstance(args, Sequence):
        return [str(a) for a in args]
    return [str(args)]


def _server_command(argv: list[str]) -> bool:
    words = [w.rsplit("/", 1)[-1] for w in argv]
    if "--check-config" in words or _refusal_expected:
        return False
    return any(a in words and b in words for a, b in _SERVERS)


_refusal_expected = False


@contextmanager
def settings_refusal() -> Iterator[None]:
    """Allow `serve` processes that must refuse their settings and exit at once: the test
    bounds each with a timeout, so one that went on to start would fail it."""
    global _refusal_expected
    _refusal_expected = True
    try:
        yield
    finally:
        _refusal_expected = False


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _active or event != "subprocess.Popen":
        return
    argv = _argv(args[1]) if len(args) > 1 and args[1] is not None else _argv(args[0])
    if _server_command(argv):
        raise TierViolation(
            f"the unit tier started a server process ({' '.join(argv)[:200]}): "
            "mark the test `engine`"
        )


_original_start = multiprocessing.process.BaseProcess.start


def _guarded_start(self: multiprocessing.process.BaseProcess) -> None:
    if _active and self.name.startswith("EngineCore"):
        raise TierViolation("the unit tier started a vLLM engine core: mark the test `engine`")
    _original_start(self)


_TESTS = Path(__file__).resolve().parent
#: The polls of `tests/clock.py` wait for a real process or thread, bounded by a deadline.
_POLLS = str(_TESTS / "clock.py")
#: Where a test may sleep on the real clock (`file` or `file::function`), and why.
REAL_CLOCK = {
    "observability/test_two_deployments.py": "Prometheus scrapes every 1 s on its own clock",
    "redis_fixtures.py::_pump": "the slow-Redis proxy: redis-py's timeouts read the real clock",
    "engine/test_fake_engine.py::test_modelled_latency_is_the_steps_time_whatever_the_host_took": (
        "a real stall is the point: modelled latency ignores what the host took"
    ),
}
_allowed = {_POLLS} | {str(_TESTS / where) for where in REAL_CLOCK}
_real_sleep = time.sleep
_real_async_sleep = asyncio.sleep
T = TypeVar("T")


def _refuse_a_test_sleep(delay: float) -> None:
    caller = sys._getframe(2)
    path = caller.f_code.co_filename
    if not (_active and delay > 0 and path.startswith(str(_TESTS))):
        return
    if path not in _allowed and f"{path}::{caller.f_code.co_name}" not in _allowed:
        where = f"{Path(path).relative_to(_TESTS.parent)}:{caller.f_lineno}"
        raise TierViolation(
            f"a unit-tier test slept {delay:g} s on the real clock ({where}): give the code "
            "under test a gateway.clock.ManualClock and advance it, or wait for the "
            "condition with tests/clock.py's until"
        )


def _guarded_sleep(seconds: float) -> None:
    _refuse_a_test_sleep(seconds)
    _real_sleep(seconds)


def _guarded_async_sleep(delay: float, result: T | None = None) -> Coroutine[Any, Any, T | None]:
    _refuse_a_test_sleep(delay)
    return _real_async_sleep(delay, result)


def pytest_configure(config: pytest.Config) -> None:
    global _active, _hook_installed
    if not _ENGINE_DESELECTED.search(config.option.markexpr or ""):
        return
    _active = True
    multiprocessing.process.BaseProcess.start = _guarded_start  # type: ignore[method-assign]
    time.sleep = _guarded_sleep  # type: ignore[assignment]
    asyncio.sleep = _guarded_async_sleep  # type: ignore[assignment]
    if not _hook_installed:  # audit hooks cannot be removed: one, switched by `_active`
        sys.addaudithook(_audit)
        _hook_installed = True


def pytest_unconfigure(config: pytest.Config) -> None:
    global _active
    _active = False
    multiprocessing.process.BaseProcess.start = _original_start  # type: ignore[method-assign]
    time.sleep = _real_sleep
    asyncio.sleep = _real_async_sleep
