"""uvicorn's server, plus: a SIGTERM/SIGINT first starts the gateway's own drain.

uvicorn alone closes the listener and waits for open connections; the drain adds
what the nothing-lost contract needs on top: requests arriving on kept-alive
connections get 503 + retry-after, and requests still running at the drain
deadline are aborted so their clients get an error event instead of a cut.
"""

from __future__ import annotations

import asyncio
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from gateway.connections import EdgeLimits, EdgeStats, bounded_protocol
from gateway.settings import GatewaySettings


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
    )


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: FastAPI) -> None:
        super().__init__(config)
        self._app = app
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The engine could not be restarted: the process must exit non-zero.
        self.fatal = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        runtime = getattr(self._app.state, "runtime", None)
        if runtime is not None:
            runtime.on_fatal = self._give_up

    def _give_up(self) -> None:
        self.fatal = True
        self.should_exit = True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        runtime = getattr(self._app.state, "runtime", None)
        if runtime is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(runtime.begin_drain)
        super().handle_exit(sig, frame)
