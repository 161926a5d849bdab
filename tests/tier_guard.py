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
`serve --check-config` serves nothing (it validates, prints, exits) and is allowed; a
`serve` that must refuse its settings and exit before it starts anything runs inside
`settings_refusal()`, under the test's timeout.
"""

from __future__ import annotations

import multiprocessing.process
import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

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


def pytest_configure(config: pytest.Config) -> None:
    global _active, _hook_installed
    if not _ENGINE_DESELECTED.search(config.option.markexpr or ""):
        return
    _active = True
    multiprocessing.process.BaseProcess.start = _guarded_start  # type: ignore[method-assign]
    if not _hook_installed:  # audit hooks cannot be removed: one, switched by `_active`
        sys.addaudithook(_audit)
        _hook_installed = True


def pytest_unconfigure(config: pytest.Config) -> None:
    global _active
    _active = False
    multiprocessing.process.BaseProcess.start = _original_start  # type: ignore[method-assign]
