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

#: The attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}


def _value(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    if text and not any(c in text for c in ' "=\\') and text.isprintable():
        return text
    return json.dumps(text)


class FieldsFormatter(logging.Formatter):
    """`logging.Formatter` plus the record's `extra` fields as `key=value`."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = [
            f"{key}={_value(value)}"
            for key, value in record.__dict__.items()
            if key not in _STANDARD and not key.startswith("_")
        ]
        return f"{line} {' '.join(fields)}" if fields else line


def configure_logging(level: str) -> None:
    """The root logger at `level`, writing `FieldsFormatter` lines to stderr."""
    handler = logging.StreamHandler()
    handler.setFormatter(FieldsFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])
