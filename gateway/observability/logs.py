"""The gateway's log lines: the message, then the record's structured fields.

The gateway logs events with their fields in `extra` ("request finished" with the
class, k, the controller's reason, status and latency; "request shed"), and the
standard `logging` formatter prints the message alone, so those fields never
reached the log. `FieldsFormatter` appends them as `key=value` pairs (logfmt: a
value with blanks or quotes is quoted), which people and log pipelines both read.
No prompt or completion text is ever put in a field (tests/reliability/test_logs.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

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


def configure_logging(level: str) -> None:
    """The root logger at `level`, writing `FieldsFormatter` lines to stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(FieldsFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
