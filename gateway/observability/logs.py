"""The gateway's log lines: the message, then the record's structured fields.

The gateway logs events with their fields in `extra` ("request finished" with the
class, k, the controller's reason, status and latency; "request shed"), and the
standard `logging` formatter prints the message alone, so those fields never
reached the log. `FieldsFormatter` appends them as `key=value` pairs (logfmt: a
value with blanks or quotes is quoted), which people and log pipelines both read.
No prompt or completion text is ever put in a field (tests/reliability/test_logs.py).

`RequestContextFilter` adds, to every line logged while a request is handled, its
`request_id` (the `x-request-id` the client sees, set by `request_context`) and the
`trace_id` / `span_id` of the current span, in the W3C trace-context hex form a trace
backend searches by (the OpenTelemetry log data model's TraceId / SpanId), so a log line
leads to its trace and the other way round.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from opentelemetry import trace

#: The request being handled by this task (and the tasks it starts); "" outside one.
_REQUEST_ID: ContextVar[str] = ContextVar("specgw_request_id", default="")

#: Set on a record by `Formatter.format` itself, not by the caller.
_FORMATTED = frozenset({"message", "asctime", "taskName"})


def _standard_keys(factory: Callable[..., logging.LogRecord]) -> frozenset[str]:
    """The attributes every record from `factory` has. A library may install a record
    factory that adds its own to every record (vLLM adds `vllm_process_name`): those are
    not the caller's fields either."""
    return frozenset(factory("", 0, "", 0, "", None, None).__dict__) | _FORMATTED


def _value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not any(c in text for c in ' "=\\') and text.isprintable():
        return text
    return json.dumps(text)


class FieldsFormatter(logging.Formatter):
    """`logging.Formatter` plus the record's `extra` fields as `key=value`."""

    _factory: Callable[..., logging.LogRecord] | None = None
    _standard: frozenset[str] = frozenset()

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        factory = logging.getLogRecordFactory()
        if factory is not self._factory:  # set once, or replaced since by a library
            self._factory, self._standard = factory, _standard_keys(factory)
        fields = [
            f"{key}={_value(value)}"
            for key, value in record.__dict__.items()
            if key not in self._standard and not key.startswith("_")
        ]
        return f"{line} {' '.join(fields)}" if fields else line


@contextmanager
def request_context(request_id: str) -> Iterator[None]:
    """Lines logged inside carry `request_id` (the request edge wraps each request in it)."""
    token = _REQUEST_ID.set(request_id)
    try:
        yield
    finally:
        _REQUEST_ID.reset(token)


class RequestContextFilter(logging.Filter):
    """Adds `request_id`, `trace_id` and `span_id` to a record logged inside a request or a
    span; a value the caller put in `extra` is kept. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = _REQUEST_ID.get()
        if request_id and not hasattr(record, "request_id"):
            record.request_id = request_id
        context = trace.get_current_span().get_span_context()
        if context.is_valid and not hasattr(record, "trace_id"):
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True


def configure_logging(level: str) -> None:
    """The root logger at `level`, writing `FieldsFormatter` lines with the request
    context to stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(FieldsFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    handler.addFilter(RequestContextFilter())
    logging.basicConfig(level=level.upper(), handlers=[handler])
