"""vLLM's error replies -> the backend's closed error set (`engine.vllm.errors`), on vLLM's
own wire models (no engine): the gateway reads none of these payloads itself."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import SimpleNamespace

import pytest

from engine.interface import EngineError, ErrorClass, InvalidRequestError
from engine.protocol import ErrorInfo, ErrorResponse
from engine.vllm.errors import class_of, framed_events, raising, refused, stream_error


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, ErrorClass.INVALID_REQUEST),
        (404, ErrorClass.NOT_FOUND),
        (413, ErrorClass.PAYLOAD_TOO_LARGE),
        (422, ErrorClass.INVALID_REQUEST),
        (500, ErrorClass.ENGINE_ERROR),
        (503, ErrorClass.NOT_READY),
    ],
)
def test_each_status_has_one_class(status: int, kind: ErrorClass) -> None:
    assert class_of(status) is kind


def test_an_error_response_keeps_its_message_and_param() -> None:
    reply = ErrorResponse(
        error=ErrorInfo(message="no such model", type="NotFoundError", param="model", code=404)
    )
    error = refused(reply)
    assert (error.kind, str(error), error.param) == (ErrorClass.NOT_FOUND, "no such model", "model")


def _line(code: object, message: str = "boom") -> str:
    body = {"error": {"message": message, "type": "x", "param": None, "code": code}}
    return f"data: {json.dumps(body)}\n\n"


@pytest.mark.parametrize(
    ("line", "kind", "message"),
    [
        (_line(400, "too long"), ErrorClass.INVALID_REQUEST, "too long"),
        (_line(404), ErrorClass.INVALID_REQUEST, "boom"),  # in a stream: the client's fault
        (_line(500), ErrorClass.ENGINE_ERROR, "boom"),
        ('data: {"error": "not an object"}\n\n', ErrorClass.ENGINE_ERROR, "engine error"),
    ],
)
def test_an_in_stream_error_line_is_the_client_s_or_the_engine_s(
    line: str, kind: ErrorClass, message: str
) -> None:
    error = stream_error(line)
    assert (error.kind, str(error)) == (kind, message)


async def _lines(*items: str) -> AsyncIterator[str]:
    for item in items:
        yield item


async def _drain(source: AsyncIterator[str], into: list[str]) -> None:
    async for item in source:
        into.append(item)


async def test_a_stream_passes_its_chunks_and_raises_its_error_line() -> None:
    chunk = 'data: {"choices":[]}\n\n'
    seen: list[str] = []
    with pytest.raises(EngineError) as caught:
        await _drain(raising(_lines(chunk, _line(400, "bad"), "data: [DONE]\n\n")), seen)
    assert seen == [chunk]
    assert caught.value.kind is ErrorClass.INVALID_REQUEST


async def _events(*items: object) -> AsyncIterator[object]:
    for item in items:
        if isinstance(item, Exception):
            raise item
        yield item


class _Event(SimpleNamespace):
    def model_dump_json(self, **_: object) -> str:
        return json.dumps({"type": self.type})


async def test_a_failure_event_or_exception_in_a_responses_stream_is_raised() -> None:
    opened = _Event(type="response.created")
    failed = _Event(type="error", code="invalid_request_error", message="bad input")
    out: list[str] = []
    with pytest.raises(EngineError) as caught:
        await _drain(framed_events(_events(opened, failed)), out)
    assert out == ['event: response.created\ndata: {"type": "response.created"}\n\n']
    assert (caught.value.kind, str(caught.value)) == (ErrorClass.INVALID_REQUEST, "bad input")

    gone = _Event(type="response.failed", response=SimpleNamespace(error=None))
    with pytest.raises(EngineError) as caught:
        _ = [t async for t in framed_events(_events(gone))]
    assert caught.value.kind is ErrorClass.ENGINE_ERROR

    with pytest.raises(EngineError) as caught:
        _ = [t async for t in framed_events(_events(RuntimeError("kaput")))]
    assert (caught.value.kind, str(caught.value)) == (ErrorClass.ENGINE_ERROR, "kaput")

    with pytest.raises(InvalidRequestError):
        _ = [t async for t in framed_events(_events(InvalidRequestError("long", "input")))]
