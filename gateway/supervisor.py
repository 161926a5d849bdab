"""Engine supervision: a dead engine core is replaced, or the process gives up loudly.

When the engine core dies, vLLM fails every in-flight request at once (they end
with errors, never silently); the supervisor then marks the replica not ready,
shuts the dead engine down and starts a new one with bounded retries and
exponential backoff. If no engine can be started, it asks the server to stop
and the process exits non-zero, so Kubernetes restarts the pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import Any

from engine.port import ServingPort

log = logging.getLogger("specgw.supervisor")

EngineStarter = Callable[[], AbstractAsyncContextManager[Any]]
#: The serving port on a started engine (a backend's `EngineBackend.serving_port`).
FrontendBuilder = Callable[[Any], Awaitable[ServingPort]]


class EngineSlot:
    """The current engine and the serving port on it; replaced whole on restart.

    `frontend` builds the backend's port on each started engine (`EngineBackend.serving_port`).
    """

    def __init__(self, start_engine: EngineStarter, frontend: FrontendBuilder) -> None:
        self._start_engine = start_engine
        self._build_frontend = frontend
        self._stack: AsyncExitStack | None = None
        self.engine: Any = None
        self.frontend: ServingPort | None = None

    async def start(self) -> None:
        stack = AsyncExitStack()
        try:
            engine = await stack.enter_async_context(self._start_engine())
            frontend = await self._build_frontend(engine)
        except BaseException:
            await stack.aclose()
            raise
        self._stack, self.engine, self.frontend = stack, engine, frontend

    async def close(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()


class EngineSupervisor:
    def __init__(
        self,
        slot: EngineSlot,
        on_down: Callable[[], None],
        on_up: Callable[[EngineSlot], None],
        on_fatal: Callable[[], None],
        *,
        interval_s: float = 1.0,
        max_restarts: int = 3,
        backoff_s: float = 2.0,
    ) -> None:
        self._slot = slot
        self._on_down = on_down
        self._on_up = on_up
        self._on_fatal = on_fatal
        self._interval_s = interval_s
        self._max_restarts = max_restarts
        self._backoff_s = backoff_s
        self._task: asyncio.Task[None] | None = None
        self.restarts = 0

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            health = await self._slot.engine.health()
            if health.alive:
                continue
            log.error("engine core is down (%s): restarting", health.detail)
            self._on_down()
            if not await self._restart():
                log.critical("engine could not be restarted; stopping the process")
                self._on_fatal()
                return

    async def _restart(self) -> bool:
        await self._slot.close()
        for attempt in range(self._max_restarts):
            await asyncio.sleep(self._backoff_s * 2**attempt)
            try:
                await self._slot.start()
            except Exception:
                log.exception("engine restart %d/%d failed", attempt + 1, self._max_restarts)
                continue
            self.restarts += 1
            log.warning("engine restarted (restart #%d)", self.restarts)
            self._on_up(self._slot)
            return True
        return False
