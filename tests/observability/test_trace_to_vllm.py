"""The trace context reaches vLLM: `OpenAIFrontend` hands vLLM's serving layer a carrier
of the current span's `traceparent` where vLLM traces, and vLLM's own request-header
readers take the trace headers from it and nothing else.

The engine-marked test runs the real gateway on the real CPU engine with vLLM's
`otlp_traces_endpoint` set, and finds vLLM's `llm_request` span in the receiver as a
child of the gateway's inference span.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from starlette.datastructures import State

from engine.protocol import ChatCompletionRequest, CompletionRequest
from engine.vllm.openai_frontend import OpenAIFrontend
from tests.observability.otlp_receiver import ReceivedSpan, running


class RecordingServing:
    """Stands in for vLLM's serving object: keeps the raw request it was handed."""

    def __init__(self) -> None:
        self.raw_requests: list[Any] = []

    async def create_chat_completion(self, request: Any, raw_request: Any) -> str:
        self.raw_requests.append(raw_request)
        return "reply"

    async def create_completion(self, request: Any, raw_request: Any) -> str:
        self.raw_requests.append(raw_request)
        return "reply"


def frontend(endpoint: str | None) -> tuple[OpenAIFrontend, RecordingServing]:
    serving = RecordingServing()
    state = State()
    state.openai_serving_chat = serving
    state.openai_serving_completion = serving
    observability = State({"otlp_traces_endpoint": endpoint})
    state.vllm_config = State({"observability_config": observability})
    return OpenAIFrontend(state, "m"), serving


def chat() -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    )


async def test_the_current_span_goes_to_vllm_as_traceparent() -> None:
    front, serving = frontend("http://collector:4317")
    tracer = TracerProvider().get_tracer("t")
    with tracer.start_as_current_span("chat m") as span:
        await front.chat(chat(), k=2, gateway_id="g1")
        await front.completion(CompletionRequest(model="m", prompt="x"), k=0, gateway_id="g2")
    context = span.get_span_context()
    flags = int(context.trace_flags)
    expected = f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"
    assert [r.headers["traceparent"] for r in serving.raw_requests] == [expected, expected]
    await check_vllm_reads_only_trace_headers(serving.raw_requests[0])


async def check_vllm_reads_only_trace_headers(carrier: Any) -> None:
    """vLLM's own readers of the raw request: the trace headers are found; the request
    id, priority, session and data-parallel rank stay the gateway's / the body's."""
    from vllm.entrypoints.generate.base.serving import GenerateBaseServing

    request = ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "request_id": "g1"}
    )
    traced = await GenerateBaseServing._get_trace_headers(None, carrier.headers)  # type: ignore[arg-type]
    assert traced == {"traceparent": carrier.headers["traceparent"]}
    assert GenerateBaseServing._base_request_id(carrier, "g1") == "g1"
    assert GenerateBaseServing._get_priority(request, carrier) == request.priority
    assert GenerateBaseServing._get_session_id(request, carrier) is None
    assert GenerateBaseServing._get_data_parallel_rank(carrier) is None
    carrier.state.request_metadata = object()  # vLLM sets it on the carrier's state


async def test_no_trace_context_where_vllm_does_not_trace_or_no_span_is_current() -> None:
    quiet, serving = frontend(None)
    with TracerProvider().get_tracer("t").start_as_current_span("chat m"):
        await quiet.chat(chat(), k=2, gateway_id="g1")
    traced, serving_traced = frontend("http://collector:4317")
    await traced.chat(chat(), k=2, gateway_id="g2")  # no span is current
    assert serving.raw_requests == [None]
    assert serving_traced.raw_requests == [None]


def joined(spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
    """[the gateway's inference span, vLLM's llm_request span in its trace], when both came."""
    inference = [s for s in spans if s.name == "chat specgw-default"]
    if not inference:
        return []
    trace_id = inference[0].trace_id
    engine = [s for s in spans if s.name == "llm_request" and s.trace_id == trace_id]
    return inference[:1] + engine


@pytest.mark.engine
def test_vllm_request_span_is_a_child_of_the_inference_span(tmp_path: Path) -> None:
    from tests.gateway.conftest import NO_CALIBRATION, start_gateway, stop_gateway

    with running() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
            # vLLM's exporter defaults to grpc; it reads this variable only.
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
            "SPECGW_ENGINE_EXTRA_ARGS": json.dumps({"otlp_traces_endpoint": receiver.endpoint}),
            **NO_CALIBRATION,
        }
        gw = start_gateway(tmp_path, extra_env=env)
        try:
            reply = gw.client().chat.completions.create(
                model="specgw-default",
                messages=[{"role": "user", "content": "Name a colour."}],
                max_tokens=8,
                temperature=0,
            )
            spans = receiver.wait_for(lambda got: len(joined(got)) == 2, timeout_s=60)
        finally:
            stop_gateway(gw)
    # The engine's warm-up and calibration requests have llm_request spans of their own,
    # each a root: the one in the inference span's trace is this request's.
    inference, engine = joined(spans)
    assert inference.attributes["gen_ai.response.id"] == reply.id
    assert engine.parent_span_id == inference.span_id
    assert reply.usage is not None
    assert engine.attributes["gen_ai.usage.completion_tokens"] == reply.usage.completion_tokens
