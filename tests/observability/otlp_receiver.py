"""An OTLP/HTTP traces receiver on a loopback port: what a collector's `otlp` receiver does.

The gateway's real exporter (`OTLPSpanExporter`, protobuf over HTTP) posts
`ExportTraceServiceRequest` messages to `/v1/traces`; this server decodes them with the
OTLP protobuf definitions (`opentelemetry-proto`) and keeps every span with its resource
and the request's headers, so tests assert on what left the process, not on an
in-memory exporter's view.
"""

from __future__ import annotations

import contextlib
import gzip
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from tests.clock import until_sync

#: `Span.SpanKind` numbers of the OTLP protocol.
KINDS = {1: "INTERNAL", 2: "SERVER", 3: "CLIENT", 4: "PRODUCER", 5: "CONSUMER"}
#: `Status.StatusCode` numbers.
STATUS = {0: "UNSET", 1: "OK", 2: "ERROR"}


def value_of(value: AnyValue) -> Any:
    """An OTLP `AnyValue` as the Python value it carries."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [value_of(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return attributes_of(value.kvlist_value.values)
    return getattr(value, kind) if kind else None


def attributes_of(pairs: Any) -> dict[str, Any]:
    return {kv.key: value_of(kv.value) for kv in pairs if isinstance(kv, KeyValue)}


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    events: list[tuple[str, dict[str, Any]]]
    status: str
    resource: dict[str, Any]
    scope: str

    @classmethod
    def decode(cls, span: Span, resource: dict[str, Any], scope: str) -> ReceivedSpan:
        return cls(
            name=span.name,
            kind=KINDS.get(span.kind, str(span.kind)),
            trace_id=span.trace_id.hex(),
            span_id=span.span_id.hex(),
            parent_span_id=span.parent_span_id.hex(),
            attributes=attributes_of(span.attributes),
            events=[(e.name, attributes_of(e.attributes)) for e in span.events],
            status=STATUS.get(span.status.code, str(span.status.code)),
            resource=resource,
            scope=scope,
        )


@dataclass
class OtlpReceiver:
    """Call `start()` (or use `running()`); `endpoint` is the full traces URL."""

    port: int = 0
    spans: list[ReceivedSpan] = field(default_factory=list)
    #: Headers of each export request, lower-cased names.
    headers: list[dict[str, str]] = field(default_factory=list)
    #: The raw (decompressed) bodies, to search for text that must never leave.
    bodies: list[bytes] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def endpoint(self) -> str:
        return f"{self.base_url}/v1/traces"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                encoding = self.headers.get("content-encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                receiver.record({k.lower(): v for k, v in self.headers.items()}, body)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = int(self._server.server_address[1])
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def record(self, headers: dict[str, str], body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        decoded: list[ReceivedSpan] = []
        for resource_spans in request.resource_spans:
            resource = attributes_of(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    decoded.append(ReceivedSpan.decode(span, resource, scope_spans.scope.name))
        with self._lock:
            self.headers.append(headers)
            self.bodies.append(body)
            self.spans.extend(decoded)

    def wait_for(
        self, ready: Callable[[list[ReceivedSpan]], bool], timeout_s: float = 10.0
    ) -> list[ReceivedSpan]:
        """The spans received, once `ready(spans)` holds (AssertionError at the timeout)."""

        def received() -> list[ReceivedSpan]:
            with self._lock:
                return list(self.spans)

        spans = received()
        with contextlib.suppress(AssertionError):
            until_sync(lambda: ready(received()), timeout_s, poll_s=0.05)
        spans = received()
        if not ready(spans):
            names = [(s.name, s.kind) for s in spans]
            raise AssertionError(f"spans not received in {timeout_s:g} s; got {names}")
        return spans


@contextmanager
def running() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
