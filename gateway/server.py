"""uvicorn's server, plus: a SIGTERM/SIGINT first starts the gateway's own drain, and one
during start-up cuts the start-up short.

uvicorn alone closes the listener and waits for open connections; the drain adds
what the nothing-lost contract needs on top: requests arriving on kept-alive
connections get 503 + retry-after, and requests still running at the drain
deadline are aborted so their clients get an error event instead of a cut.

Start-up (the engine, then tens of seconds of calibration) is the app's lifespan.
uvicorn's signal handler only sets `should_exit`, which it reads once the lifespan's
start-up has finished, so a pod terminated during start-up would wait out its grace
period; and a lifespan cut short under uvicorn is a failed start-up (a traceback at
ERROR, exit status 3). The server therefore enters the app's lifespan itself (uvicorn's
own is off), in its start-up, where a signal cancels it: the lifespan unwinds (the
engine shuts down), one INFO line says so, the port is never bound, and uvicorn
re-raises the signal as it does after a drain.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from uvicorn.config import STARTUP_FAILURE

from gateway.connections import EdgeLimits, EdgeStats, bounded_protocol
from gateway.settings import GatewaySettings

log = logging.getLogger("specgw")
#: uvicorn's logger, for the lines its own lifespan would log.
uvicorn_log = logging.getLogger("uvicorn.error")


def server_config(app: FastAPI, settings: GatewaySettings) -> uvicorn.Config:
    """uvicorn's config for the gateway: the bounded HTTP/1.1 protocol (gateway.connections),
    its keep-alive timeout, and a hard stop after the gateway's own drain."""
    limits = EdgeLimits(
        header_timeout_s=settings.header_timeout_s,
        max_header_bytes=settings.max_header_bytes,
        max_connections=settings.max_connections,
    )
    stats = getattr(app.state, "edge_stats", None) or EdgeStats()
    app.state.edge_stats = stats
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        http=bounded_protocol(limits, stats),
        timeout_keep_alive=settings.keep_alive_timeout_s,
        # The gateway's drain ends leftover requests with errors at drain_timeout_s;
        # uvicorn's hard stop comes after that.
        timeout_graceful_shutdown=int(settings.drain_timeout_s) + 10,
        access_log=False,
        # DrainingServer enters the app's lifespan itself, where a signal can cancel it.
        lifespan="off",
    )


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The app's lifespan once its start-up has finished; exited at shutdown.
        self._lifespan: AbstractAsyncContextManager[Mapping[str, Any] | None] | None = None
        #: The task running the app's start-up, while it runs.
        self._starting: asyncio.Task[None] | None = None
        #: The signal that cut start-up short (None: start-up was not interrupted).
        self.interrupted_by: int | None = None
        #: The engine could not be restarted: the process must exit non-zero.
        self.fatal = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        if not await self._start_app():
            return  # `started` stays False: uvicorn neither serves nor shuts down
        try:
            await super().startup(sockets)  # binds the port: exits where it is taken
        except BaseException:
            await self._stop_app()
            raise
        runtime = getattr(self._app.state, "runtime", None)
        if runtime is not None:
            runtime.on_fatal = self._give_up

    async def _start_app(self) -> bool:
        """Enter the app's lifespan; False where a signal cut it short (it has unwound)."""
        lifespan = self._app.router.lifespan_context(self._app)
        task = asyncio.current_task()
        assert task is not None
        entered = False
        self._starting = task
        try:
            if self.interrupted_by is None:
                await lifespan.__aenter__()
                entered = True
        except asyncio.CancelledError:
            if self.interrupted_by is None:
                raise
            task.uncancel()
        except Exception:
            # As uvicorn's own lifespan reports a failed start-up, with its exit status.
            uvicorn_log.exception("Application startup failed. Exiting.")
            sys.exit(STARTUP_FAILURE)
        finally:
            self._starting = None
        if self.interrupted_by is None:
            self._lifespan = lifespan
            return True
        if entered:  # the signal came as the start-up ended, before the runtime was published
            await lifespan.__aexit__(None, None, None)
        name = signal.Signals(self.interrupted_by).name
        log.info("start-up interrupted by %s: the engine is shut down; exiting", name)
        return False

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().shutdown(sockets)
        finally:
            await self._stop_app()

    async def _stop_app(self) -> None:
        """Exit the app's lifespan (the drain, then the engine's shutdown), once."""
        lifespan, self._lifespan = self._lifespan, None
        if lifespan is None:
            return
        try:
            await lifespan.__aexit__(None, None, None)
        except Exception:
            uvicorn_log.exception("Application shutdown failed. Exiting.")

    def _give_up(self) -> None:
        self.fatal = True
        self.should_exit = True

    def _interrupt_start(self) -> None:
        if self._starting is not None:
            self._starting.cancel()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        runtime = getattr(self._app.state, "runtime", None)
        if runtime is not None:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(runtime.begin_drain)
        elif not self.started and self.interrupted_by is None:
            self.interrupted_by = sig
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._interrupt_start)
        super().handle_exit(sig, frame)
