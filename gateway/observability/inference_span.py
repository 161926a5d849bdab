"""The GenAI inference span: one per request that reaches the engine, under its HTTP span.

By the OpenTelemetry GenAI semantic conventions for a client inference span
(https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/):

* name `{gen_ai.operation.name} {gen_ai.request.model}` (`chat specgw-default`,
  `text_completion specgw-default`);
* kind INTERNAL: the conventions ask for CLIENT, and allow INTERNAL "on spans
  representing call to models running in the same process", which the gateway's
  embedded vLLM engine is;
* `gen_ai.operation.name`, `gen_ai.provider.name` (the name that replaced
  `gen_ai.system`), `gen_ai.request.model` and the sampling parameters the client set
  at creation, so a sampler can see them, with its `gen_ai.request.stop_sequences` and
  `gen_ai.output.type` (Conditionally Required where the request asks for an output
  format: `json` for OpenAI's `json_object` and `json_schema`, `text` for `text`);
  `gen_ai.response.*` and `gen_ai.usage.*` at the end, and for a stream
  `gen_ai.response.time_to_first_chunk` (Recommended: seconds from the request's
  arrival at the gateway to its first answer chunk);
* a failed request: status ERROR, `error.type` the gateway's error code
  (`gateway.errors.ErrorKind.label`, a closed set) or the exception's name, and
  `error` as its finish reason.

The gateway adds `specgw.class`, `specgw.k`, `specgw.reason` (the controller's) and the
request's measured speculation (`specgw.acceptance_length`, ...); the controller's
decision changes and drifts land on it as events while `current()` holds it. Its
context is what `engine.vllm.openai_frontend` passes on to vLLM as `traceparent`. No prompt
or completion text is ever set.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.util.types import AttributeValue

from gateway.control.plane import Plan
from gateway.observability.tracing import (
    ERROR_TYPE,
    GEN_AI_CACHE_READ_TOKENS,
    GEN_AI_INPUT_TOKENS,
    GEN_AI_OPERATION,
    GEN_AI_OUTPUT_TOKENS,
    GEN_AI_OUTPUT_TYPE,
    GEN_AI_PROVIDER,
    GEN_AI_REQUEST_FREQUENCY_PENALTY,
    GEN_AI_REQUEST_MAX_TOKENS,
    GEN_AI_REQUEST_MODEL,
    GEN_AI_REQUEST_PRESENCE_PENALTY,
    GEN_AI_REQUEST_SEED,
    GEN_AI_REQUEST_STOP_SEQUENCES,
    GEN_AI_REQUEST_STREAM,
    GEN_AI_REQUEST_TEMPERATURE,
    GEN_AI_REQUEST_TOP_K,
    GEN_AI_REQUEST_TOP_P,
    GEN_AI_RESPONSE_FINISH_REASONS,
    GEN_AI_RESPONSE_ID,
    GEN_AI_RESPONSE_MODEL,
    GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK,
    SPECGW_ACCEPTANCE_LENGTH,
    SPECGW_ACCEPTED_TOKENS,
    SPECGW_CAP,
    SPECGW_CLASS,
    SPECGW_CLASS_ID,
    SPECGW_DRAFT_TOKENS,
    SPECGW_K,
    SPECGW_REASON,
    SPECGW_VERIFY_STEPS,
)

if TYPE_CHECKING:
    from gateway.replies import Finished

#: `gen_ai.provider.name`: the serving stack behind the gateway.
PROVIDER = "vllm"
#: The gateway's endpoint -> `gen_ai.operation.name` (OpenAI's Responses API is `chat`).
OPERATIONS = {"chat": "chat", "completions": "text_completion", "responses": "chat"}
#: `error.type` of a stream the client left before its end.
CLIENT_DISCONNECTED = "client_disconnected"

# (attribute, request fields in order of preference): OpenAI's newer name first.
_MAX_TOKENS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
_FLOAT_PARAMS = (
    (GEN_AI_REQUEST_TEMPERATURE, "temperature"),
    (GEN_AI_REQUEST_TOP_P, "top_p"),
    (GEN_AI_REQUEST_FREQUENCY_PENALTY, "frequency_penalty"),
    (GEN_AI_REQUEST_PRESENCE_PENALTY, "presence_penalty"),
)
#: OpenAI's output format types -> `gen_ai.output.type` (its well-known values: text,
#: json, image, speech); a format outside these (vLLM's `structural_tag`) is not reported.
_OUTPUT_TYPES = {"text": "text", "json_object": "json", "json_schema": "json"}


def output_type(request: Any) -> str | None:
    """The output type the request asks for: chat's and completions' `response_format`,
    the Responses API's `text.format`; None where it asks for none."""
    text = getattr(request, "text", None)
    form = getattr(text, "format", None) if text is not None else None
    form = form or getattr(request, "response_format", None)
    kind = getattr(form, "type", None)
    return _OUTPUT_TYPES.get(kind) if isinstance(kind, str) else None


def stop_sequences(request: Any) -> list[str]:
    """The request's stop strings (OpenAI's `stop`: one string or a list)."""
    stop = getattr(request, "stop", None)
    if isinstance(stop, str):
        return [stop] if stop else []
    if isinstance(stop, list):
        return [s for s in stop if isinstance(s, str) and s]
    return []


def request_attributes(request: Any) -> dict[str, AttributeValue]:
    """The sampling parameters the client set (a field left unset is not reported: the
    conventions ask for the request's setting, not the model's default)."""
    out: dict[str, AttributeValue] = {}
    for name in _MAX_TOKENS:
        value = getattr(request, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            out[GEN_AI_REQUEST_MAX_TOKENS] = value
            break
    for attribute, name in _FLOAT_PARAMS:
        value = getattr(request, name, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[attribute] = float(value)
    top_k = getattr(request, "top_k", None)
    if isinstance(top_k, int) and top_k > 0:  # vLLM: 0 or -1 = off
        out[GEN_AI_REQUEST_TOP_K] = top_k
    seed = getattr(request, "seed", None)
    if isinstance(seed, int) and not isinstance(seed, bool):
        out[GEN_AI_REQUEST_SEED] = seed
    stops = stop_sequences(request)
    if stops:
        out[GEN_AI_REQUEST_STOP_SEQUENCES] = stops
    kind = output_type(request)
    if kind is not None:
        out[GEN_AI_OUTPUT_TYPE] = kind
    return out


def plan_attributes(plan: Plan) -> dict[str, AttributeValue]:
    """What the control plane decided for the request, and why."""
    out: dict[str, AttributeValue] = {
        SPECGW_CLASS: plan.label,
        SPECGW_CLASS_ID: plan.class_id,
        SPECGW_K: plan.k,
        SPECGW_REASON: plan.reason,
    }
    if plan.cap is not None:
        out[SPECGW_CAP] = plan.cap
    return out


def end_attributes(finished: Finished, model: str) -> dict[str, AttributeValue]:
    """The response's side: finish reasons, usage, measured speculation, the error."""
    out: dict[str, AttributeValue] = {}
    outcome, error = finished.outcome, finished.error
    if outcome is not None:
        spec = outcome.speculation
        out.update(
            {
                GEN_AI_RESPONSE_MODEL: model,
                GEN_AI_INPUT_TOKENS: outcome.prompt_tokens,
                GEN_AI_OUTPUT_TOKENS: outcome.output_tokens,
                GEN_AI_CACHE_READ_TOKENS: outcome.cached_prompt_tokens,
                SPECGW_ACCEPTANCE_LENGTH: spec.acceptance_length,
                SPECGW_VERIFY_STEPS: spec.verify_steps,
                SPECGW_DRAFT_TOKENS: spec.draft_tokens,
                SPECGW_ACCEPTED_TOKENS: spec.accepted_tokens,
            }
        )
    if finished.stream and finished.ttft_s is not None:
        out[GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] = finished.ttft_s
    if finished.status == "complete":
        if outcome is not None and outcome.finish_reason:
            out[GEN_AI_RESPONSE_FINISH_REASONS] = [outcome.finish_reason]
    else:
        out[GEN_AI_RESPONSE_FINISH_REASONS] = ["error"]
        out[ERROR_TYPE] = error.kind.label if error is not None else CLIENT_DISCONNECTED
    return out


class InferenceSpan:
    """One request's inference span; every method is a no-op when tracing is off."""

    __slots__ = ("_ended", "_model", "_span")

    def __init__(self, span: Span, model: str) -> None:
        self._span = span
        self._model = model
        self._ended = False

    @property
    def span(self) -> Span:
        return self._span

    @contextmanager
    def current(self) -> Iterator[None]:
        """Make this span the current one (the engine call, the controller's events)."""
        if not self._span.get_span_context().is_valid:
            yield
            return
        with trace.use_span(self._span, record_exception=False, set_status_on_exception=False):
            yield

    def finish(self, finished: Finished) -> None:
        """End it with the request's outcome (idempotent: the first end wins)."""
        if self._ended:
            return
        self._ended = True
        if not self._span.is_recording():
            return
        attributes = end_attributes(finished, self._model)
        self._span.set_attributes(attributes)
        if ERROR_TYPE in attributes:
            self._span.set_status(Status(StatusCode.ERROR, str(attributes[ERROR_TYPE])))
        self._span.end()

    def interrupted(self, exc: BaseException) -> None:
        """End it for a request cut short by an exception outside the error set
        (cancellation when the client leaves, a bug): `error.type` is its class name."""
        if self._ended:
            return
        self._ended = True
        if not self._span.is_recording():
            return
        name = type(exc).__qualname__
        self._span.set_attributes({ERROR_TYPE: name, GEN_AI_RESPONSE_FINISH_REASONS: ["error"]})
        self._span.set_status(Status(StatusCode.ERROR, name))
        self._span.end()


#: The span of a request that is not traced (tracing off, or a caller without one).
UNTRACED = InferenceSpan(INVALID_SPAN, "")


class InferenceSpans:
    """Opens inference spans on the gateway's tracer; without one (tracing off), every
    span is the invalid, non-recording one and costs nothing."""

    def __init__(self, tracer: Tracer | None = None) -> None:
        self._tracer = tracer

    def start(
        self,
        endpoint: str,
        model: str,
        request: Any,
        plan: Plan,
        response_id: str,
        stream: bool,
    ) -> InferenceSpan:
        """The span of one request, under the current (HTTP server) span."""
        if self._tracer is None:
            return UNTRACED
        operation = OPERATIONS.get(endpoint, endpoint)
        requested = getattr(request, "model", None)
        requested = requested if isinstance(requested, str) and requested else model
        attributes: dict[str, AttributeValue] = {
            GEN_AI_OPERATION: operation,
            GEN_AI_PROVIDER: PROVIDER,
            GEN_AI_REQUEST_MODEL: requested,
            GEN_AI_RESPONSE_ID: response_id,
            **request_attributes(request),
            **plan_attributes(plan),
        }
        if stream:
            attributes[GEN_AI_REQUEST_STREAM] = True
        span = self._tracer.start_span(
            f"{operation} {requested}", kind=SpanKind.INTERNAL, attributes=attributes
        )
        return InferenceSpan(span, model)
