"""uvicorn's server, plus: the port is bound before the engine starts, a SIGTERM/SIGINT
first starts the gateway's own drain, and one during start-up cuts the start-up short.

uvicorn alone closes the listener and waits for open connections; the drain adds
what the nothing-lost contract needs on top: requests arriving on kept-alive
connections get 503 + retry-after, and requests still running at the drain
deadline are aborted so their clients get an error event instead of a cut.

Start-up (the engine, then tens of seconds of calibration; minutes for a large model on
a GPU) is the app's lifespan. uvicorn runs a lifespan's start-up before it binds, and
reads its `should_exit` only once that start-up has finished: for minutes there would
be no `/health`, `/ready` or `/metrics`, and a pod terminated meanwhile would wait out
its grace period. The server therefore binds first and enters the app's lifespan itself
(uvicorn's own is off), in a task of its own: the probes answer with the phase
(`gateway.phase`) while it runs, and a signal cancels it: the lifespan unwinds (the
engine shuts down), one INFO line says so, and uvicorn re-raises the signal as it does
after a drain. A start-up that fails is logged as uvicorn logs one and the process
exits non-zero (`fatal`, exit status 3 from `spec-gateway serve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from gateway.connections import EdgeLimits, EdgeStats, bounded_protocol
from gateway.phase import Phase
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
    """Binds the port first, then runs the app's start-up in a task of its own."""

    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The task that enters the app's lifespan, holds it while serving, and exits it.
        self._app_task: asyncio.Task[None] | None = None
        #: Set once the lifespan's start-up has finished (the runtime is published).
        self._entered = False
        #: Set at shutdown: the app task exits the lifespan (the drain, the engine's stop).
        self._stop = asyncio.Event()
        #: The signal that cut start-up short (None: start-up was not interrupted).
        self.interrupted_by: int | None = None
        #: The engine could not be started or restarted: the process must exit non-zero.
        self.fatal = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)  # binds the port: exits where it is taken
        self._app_task = self._loop.create_task(self._run_app(), name="specgw-lifespan")

    async def _run_app(self) -> None:
        """Enter the app's lifespan (the engine, the calibration), hold it until shutdown,
        exit it; one task does all three, so the lifespan starts and ends in one context."""
        lifespan = self._app.router.lifespan_context(self._app)
        try:
            await lifespan.__aenter__()
        except asyncio.CancelledError:
            # Cut short (a signal, or the server stopping): the lifespan has unwound.
            name = signal.Signals(self.interrupted_by or signal.SIGTERM).name
            log.info("start-up interrupted by %s: the engine is shut down; exiting", name)
            return
        except Exception:
            # As uvicorn's own lifespan reports a failed start-up; the process exits
            # non-zero (`fatal`) once the server has stopped.
            uvicorn_log.exception("Application startup failed. Exiting.")
            self._give_up()
            return
        self._entered = True
        runtime = getattr(self._app.state, "runtime", None)
        if runtime is not None:
            runtime.on_fatal = self._give_up
        try:
            await self._stop.wait()
        finally:
            try:
                await lifespan.__aexit__(None, None, None)
            except Exception:
                uvicorn_log.exception("Application shutdown failed. Exiting.")

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().shutdown(sockets)
        finally:
            await self._stop_app()

    async def _stop_app(self) -> None:
        """Exit the app's lifespan (the drain, then the engine's shutdown), once; a
        start-up still running is cut short."""
        task, self._app_task = self._app_task, None
        if task is None:
            return
        if not self._entered:
            task.cancel()
        self._stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    def _give_up(self) -> None:
        self.fatal = True
        self.should_exit = True

    def _interrupt_start(self) -> None:
        name = signal.Signals(self.interrupted_by or signal.SIGTERM).name
        self._app.state.phases.enter(Phase.DRAINING, f"{name} during start-up")
        if self._app_task is not None and not self._entered:
            self._app_task.cancel()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        runtime = getattr(self._app.state, "runtime", None)
        if runtime is not None:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(runtime.begin_drain)
        elif not self._entered and self.interrupted_by is None:
            self.interrupted_by = sig
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._interrupt_start)
        super().handle_exit(sig, frame)
