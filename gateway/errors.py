"""The one closed set of errors the gateway can return.

Each error kind maps once to an HTTP status, an OpenAI `error.type`, a stable
`code`, and the metric label used in `specgw_requests_total{error_type=...}`;
the same object renders as a JSON body before the first byte and as an SSE
error event after it (the nothing-lost contract, see README). Modelled on TGI's
`InferError` -> status / `error_type()`; the wire shape is vLLM's `ErrorResponse`.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field

from engine.interface import EngineError


class ErrorKind(enum.Enum):
    """(HTTP status, OpenAI error.type, metric label)."""

    INVALID_REQUEST = (400, "invalid_request_error", "invalid_request")
    UNAUTHORIZED = (401, "authentication_error", "unauthorized")
    FORBIDDEN = (403, "permission_error", "forbidden")
    NOT_FOUND = (404, "not_found_error", "not_found")
    REQUEST_TIMEOUT = (408, "invalid_request_error", "request_timeout")
    PAYLOAD_TOO_LARGE = (413, "invalid_request_error", "payload_too_large")
    HEADERS_TOO_LARGE = (431, "invalid_request_error", "headers_too_large")
    OVERLOADED = (429, "rate_limit_error", "overloaded")
    #: A key's own per-minute or concurrency limit; OpenAI's shape (type "requests" /
    #: "tokens", code "rate_limit_exceeded"), unlike OVERLOADED, which is the gateway's.
    RATE_LIMITED_REQUESTS = (429, "requests", "rate_limit_exceeded")
    RATE_LIMITED_TOKENS = (429, "tokens", "rate_limit_exceeded")
    ENGINE_ERROR = (500, "server_error", "engine_error")
    NOT_READY = (503, "service_unavailable", "not_ready")
    DRAINING = (503, "service_unavailable", "draining")
    STREAM_STALLED = (504, "timeout_error", "stream_stalled")

    @property
    def status(self) -> int:
        return self.value[0]

    @property
    def openai_type(self) -> str:
        return self.value[1]

    @property
    def label(self) -> str:
        return self.value[2]


@dataclass(slots=True)
class GatewayError(Exception):
    """An error with a known kind; `param` names the offending request field."""

    kind: ErrorKind
    message: str
    param: str | None = None
    retry_after_s: int | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)

    @property
    def status(self) -> int:
        return self.kind.status

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind.openai_type,
                "param": self.param,
                "code": self.kind.label,
            }
        }

    def response_headers(self) -> dict[str, str]:
        out = dict(self.headers)
        if self.retry_after_s is not None:
            out["retry-after"] = str(self.retry_after_s)
        return out

    def sse_event(self) -> str:
        """The in-stream form: an SSE `data:` event carrying the same error object.

        OpenAI SDKs raise `APIError` when a streamed chunk has an `error` key, so a
        failure after the first byte is never mistaken for a finished answer.
        """
        return f"data: {json.dumps(self.body(), separators=(',', ':'))}\n\n"


def invalid(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(ErrorKind.INVALID_REQUEST, message, param=param)


#: A backend's error classes (`engine.interface.ErrorClass`, by value), one kind each.
_ENGINE_KINDS: dict[str, ErrorKind] = {
    "invalid_request": ErrorKind.INVALID_REQUEST,
    "not_found": ErrorKind.NOT_FOUND,
    "payload_too_large": ErrorKind.PAYLOAD_TOO_LARGE,
    "not_ready": ErrorKind.NOT_READY,
    "engine_error": ErrorKind.ENGINE_ERROR,
}


def from_engine(exc: EngineError) -> GatewayError:
    """A backend's error (already in its closed set: the backend translated its library's
    replies, `engine.port`) as the gateway's; the mapping is one to one."""
    return GatewayError(_ENGINE_KINDS[exc.kind.value], str(exc), param=exc.param)
