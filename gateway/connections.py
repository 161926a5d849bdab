"""Bounds on what a client connection may hold before the app sees a request.

uvicorn alone keeps a connection that sends half a request line, or headers one
byte a minute, open for ever, accepts any number of them, and buffers headers of
any size (httptools). This HTTP/1.1 protocol (uvicorn's httptools one, plus three
checks) bounds each, at the server layer, before any ASGI task exists:

* header deadline: the request line and headers must arrive within
  `header_timeout_s` of the connection opening or of the previous response's end
  (slowloris); else 408 (or a plain close when no byte came) and the connection ends;
* header size: request line plus headers at most `max_header_bytes`, counted as
  they are parsed and, for a header still incomplete, as its bytes arrive; beyond,
  431 (RFC 6585 section 5) and the connection ends;
* open connections: at most `max_connections` per replica; one more gets 503 and
  is closed at once, so file descriptors and buffers stay bounded.

The body's deadline is the app's (`gateway.app.RequestEdge` reads the body), so
its 408 carries the request id. Errors have OpenAI's shape (`gateway.errors`).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.errors import ErrorKind, GatewayError

#: Longest wait, after an error answer, for the client to stop sending and close.
LINGER_S = 2.0


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """The connection bounds (GatewaySettings: header_timeout_s, max_header_bytes,
    max_connections)."""

    header_timeout_s: float
    max_header_bytes: int
    max_connections: int


@dataclass(slots=True)
class EdgeStats:
    """Open connections, and those the edge ended by reason (for the metrics exporter)."""

    open_connections: int = 0
    header_timeouts: int = 0
    body_timeouts: int = 0
    headers_too_large: int = 0
    connections_refused: int = 0


def raw_error(error: GatewayError) -> bytes:
    """A complete HTTP/1.1 response for `error` that closes the connection."""
    body = json.dumps(error.body(), separators=(",", ":")).encode()
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        **error.response_headers(),
        "connection": "close",
    }
    head = b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers.items())
    return STATUS_LINE[error.status] + head + b"\r\n" + body


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the header deadline, header size and
    connection bounds; `limits` and `stats` are bound by `bounded_protocol`."""

    limits: EdgeLimits
    stats: EdgeStats

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._awaiting_headers = True
        self._pending_bytes = 0  # received while this request's headers are incomplete
        self._header_bytes = 0  # request line and headers parsed so far
        self._header_deadline: asyncio.TimerHandle | None = None
        self._rejected = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # type: ignore[arg-type]
        self.stats.open_connections += 1
        if len(self.connections) > self.limits.max_connections:
            self.stats.connections_refused += 1
            error = GatewayError(
                ErrorKind.NOT_READY,
                f"more than {self.limits.max_connections} open connections on this replica",
                retry_after_s=1,
            )
            self._end(error)
            return
        self._await_headers()

    def connection_lost(self, exc: Exception | None) -> None:
        self.stats.open_connections -= 1
        self._cancel_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._reading_headers():
            self._pending_bytes += len(data)
        super().data_received(data)
        if (
            self._reading_headers()
            and self._pending_bytes > self.limits.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._too_large()

    def _reading_headers(self) -> bool:
        """Bytes now are a request's line and headers (not the tail of a body still
        arriving after the app answered early, e.g. a 413)."""
        return self._awaiting_headers and (self.cycle is None or not self.cycle.more_body)

    def on_message_begin(self) -> None:
        if self._rejected:
            return
        super().on_message_begin()
        self._awaiting_headers = True
        self._header_bytes = 0

    def on_url(self, url: bytes) -> None:
        if self._rejected:
            return
        self._header_bytes += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._rejected:
            return
        self._header_bytes += len(name) + len(value) + 4  # ": " and CRLF
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._rejected:
            return
        self._awaiting_headers = False
        self._pending_bytes = 0
        self._cancel_deadline()
        if self._header_bytes > self.limits.max_header_bytes:
            self._too_large()
            return
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._rejected:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if not self._rejected:
            super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and not self.pipeline:
            self._await_headers()

    def _await_headers(self) -> None:
        self._awaiting_headers = True
        self._pending_bytes = 0
        self._cancel_deadline()
        self._header_deadline = self.loop.call_later(
            self.limits.header_timeout_s, self._headers_late
        )

    def _cancel_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if not self._awaiting_headers or self.transport.is_closing():
            return
        self.stats.header_timeouts += 1
        if self._pending_bytes == 0:  # an idle connection: nothing to answer
            self.transport.close()
            return
        limit = self.limits.header_timeout_s
        self._end(GatewayError(ErrorKind.REQUEST_TIMEOUT, f"request headers not sent in {limit} s"))

    def _too_large(self) -> None:
        self.stats.headers_too_large += 1
        limit = self.limits.max_header_bytes
        self._end(GatewayError(ErrorKind.HEADERS_TOO_LARGE, f"request headers over {limit} bytes"))

    def _end(self, error: GatewayError) -> None:
        """Answer `error` and close; the parser's further callbacks are ignored."""
        self._rejected = True
        self._awaiting_headers = False
        self._cancel_deadline()
        self.transport.write(raw_error(error))
        if self.transport.can_write_eof():
            # Lingering close: a client still sending would get a reset (and lose the
            # answer) if the socket closed with its bytes unread; they are discarded
            # until it closes or LINGER_S passes.
            self.transport.write_eof()
            self.loop.call_later(LINGER_S, self.transport.close)
        else:
            self.transport.close()


def bounded_protocol(limits: EdgeLimits, stats: EdgeStats) -> type[BoundedHttpToolsProtocol]:
    """The protocol class for `uvicorn.Config(http=...)`, bound to these limits and stats."""
    return type(
        "GatewayHttpProtocol", (BoundedHttpToolsProtocol,), {"limits": limits, "stats": stats}
    )
