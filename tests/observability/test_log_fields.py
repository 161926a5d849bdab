"""Log lines carry the record's structured fields and the request's ids
(`gateway.observability.logs`)."""

from __future__ import annotations

import io
import logging

from opentelemetry.sdk.trace import TracerProvider

from gateway.observability.logs import FieldsFormatter, RequestContextFilter, request_context


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


def _context_line(**extra: object) -> str:
    """A line through the formatter and `RequestContextFilter`, as `configure_logging` has it."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(FieldsFormatter("%(levelname)s %(message)s"))
    handler.addFilter(RequestContextFilter())
    log = logging.getLogger(f"test-log-context-{id(buf)}")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.info("request finished", extra=extra)
    return buf.getvalue().strip()


def test_a_line_inside_a_request_and_a_span_carries_their_ids() -> None:
    provider = TracerProvider()
    with request_context("req-7"), provider.get_tracer("t").start_as_current_span("s") as span:
        line = _context_line(k=2)
    context = span.get_span_context()
    trace_id, span_id = format(context.trace_id, "032x"), format(context.span_id, "016x")
    assert (
        line == f"INFO request finished k=2 request_id=req-7 trace_id={trace_id} span_id={span_id}"
    )


def test_outside_a_request_no_ids_are_made_up() -> None:
    assert _context_line(k=2) == "INFO request finished k=2"
    with request_context("req-8"):
        pass
    assert _context_line() == "INFO request finished"  # the id does not outlive its request


def test_an_id_the_caller_gave_is_kept() -> None:
    with request_context("req-9"):
        assert _context_line(request_id="explicit") == "INFO request finished request_id=explicit"
