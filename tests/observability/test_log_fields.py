"""Log lines carry the record's structured fields (`gateway.observability.logs`)."""

from __future__ import annotations

import io
import logging

from gateway.observability.logs import FieldsFormatter


def _line(**extra: object) -> str:
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(FieldsFormatter("%(levelname)s %(message)s"))
    log = logging.getLogger(f"test-log-fields-{id(buf)}")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.info("request finished", extra=extra)
    return buf.getvalue().strip()


def test_extra_fields_follow_the_message_as_key_value_pairs() -> None:
    line = _line(**{"class": "chat/len:64/t1", "k": 3, "e2e_s": 0.25, "error": None})
    assert line == "INFO request finished class=chat/len:64/t1 k=3 e2e_s=0.25 error=null"


def test_a_value_with_blanks_or_quotes_is_quoted() -> None:
    line = _line(reason='batch: k=2, not 3 "held"')
    assert line == 'INFO request finished reason="batch: k=2, not 3 \\"held\\""'


def test_a_record_without_fields_is_the_plain_line() -> None:
    assert _line() == "INFO request finished"


def test_attributes_a_record_factory_gives_every_record_are_not_fields() -> None:
    """vLLM installs a record factory that adds `vllm_process_name` to every record."""
    original = logging.getLogRecordFactory()

    def factory(*args: object, **kwargs: object) -> logging.LogRecord:
        record = original(*args, **kwargs)
        record.process_label = "MainProcess"
        return record

    logging.setLogRecordFactory(factory)
    try:
        assert _line(k=2) == "INFO request finished k=2"
    finally:
        logging.setLogRecordFactory(original)
