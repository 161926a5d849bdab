"""The inference service: intake -> plan k -> key limits and admission -> an `Exchange`.

Routes stay thin (parse, call this, pick JSON or SSE). The control plane plans each request
and owns its life in the batch; each admitted request is one `gateway.exchange.Exchange`,
which serves it through the port and ends it once (its outcome and telemetry reported).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import Tracer

from engine.interface import SPEC_CLASS_ARG, EngineError, EngineStep
from engine.port import RESERVED_XARGS, SampledRequest, ServingPort
from engine.protocol import ChatCompletionRequest, CompletionRequest, ResponsesRequest
from gateway import limits
from gateway.admission import ANY_KEY, Admission
from gateway.control.features import sampling_bucket, unserved_by_drafts
from gateway.control.plane import ControlPlane, PlannedRequest
from gateway.errors import GatewayError, from_engine
from gateway.exchange import Exchange, PortCall, Settlement
from gateway.intake import approx_tokens, chat_intake, check_tools, completion_intake
from gateway.observability.inference_span import InferenceSpans
from gateway.replies import SAMPLED_NOT_EXACT, JsonReply, StreamReply, Telemetry
from gateway.request_clock import RequestClock, stamp_arrival
from gateway.responses_request import chat_reading, refuse_unserved, text_format_schema
from gateway.settings import GatewaySettings
from gateway.speculation_report import ReportLevel, SpeculationReport, requested_level
from gateway.tenants import KeyLimiter, Tenant
from gateway.tenants.admit import admit
from gateway.tenants.directory import UNLIMITED_ANONYMOUS


def _chat_max_tokens(request: ChatCompletionRequest) -> int | None:
    """A chat request's `max_tokens`, read past the field's deprecation descriptor (vLLM
    deprecates it for `max_completion_tokens`): pydantic's descriptor calls `warnings.warn`
    on every read, a DeprecationWarning no one sees, at a cost per request."""
    value: int | None = request.__dict__.get("max_tokens")
    return value


class InferenceService:
    def __init__(
        self,
        settings: GatewaySettings,
        frontend: ServingPort,
        plane: ControlPlane,
        admission: Admission,
        telemetry: Telemetry | None = None,
        limiter: KeyLimiter | None = None,
    ) -> None:
        self._settings = settings
        self._limiter = limiter
        self._frontend = frontend
        self._plane = plane
        self._admission = admission
        self._telemetry = telemetry
        #: gateway id -> the request being served, for aborting at the drain deadline.
        self._inflight: dict[str, Exchange] = {}
        self._settlement = Settlement(
            admission, limiter, telemetry, settings.stream_idle_timeout_s, self._inflight
        )
        self._abort: Callable[[str], Awaitable[None]] | None = None
        self._spans = InferenceSpans()

    def observe_step(self, step: EngineStep) -> None:
        """One timed engine step (`Engine.on_step`) to the control plane."""
        filed = self._plane.observe_step(step)
        if self._telemetry is not None:
            self._telemetry.engine_step(filed, step)

    def trace_with(self, tracer: Tracer) -> None:
        """Open each request's GenAI inference span on `tracer` (tracing is on)."""
        self._spans = InferenceSpans(tracer)

    def set_aborter(self, abort: Callable[[str], Awaitable[None]]) -> None:
        self._abort = abort

    def rebind(self, frontend: ServingPort, abort: Callable[[str], Awaitable[None]]) -> None:
        """Point new requests at a restarted engine (the supervisor calls this)."""
        self._frontend = frontend
        self._abort = abort

    async def abort_all(self) -> int:
        """Abort every in-flight engine request; their clients get an error, not a cut."""
        if self._abort is None:
            return 0
        ids = [exchange.engine_id for exchange in self._inflight.values()]
        for engine_id in ids:
            await self._abort(engine_id)
        return len(ids)

    @property
    def served_model_name(self) -> str:
        return self._frontend.served_model_name

    def _exact(self, planned: PlannedRequest, sampling: str) -> PlannedRequest:
        """k = 0 where speculation would change what the request samples: a sampled
        request (`sampling`, its temperature's bucket; "" when greedy) on an engine
        whose sampled speculation is not lossless."""
        if planned.engine_k > 0 and sampling and not self._frontend.lossless_sampling:
            return planned.without_speculation(SAMPLED_NOT_EXACT)
        return planned

    def enter(self, endpoint: str, key: str = ANY_KEY) -> None:
        """At arrival, before the body is parsed: take an edge ticket of `key` (a tenant's
        key digest) or shed now.

        The caller returns the ticket with `leave` when the response has ended.
        """
        try:
            self._admission.enter(key)
        except GatewayError as exc:
            if self._telemetry is not None:
                self._telemetry.request_shed(endpoint, exc)
            raise
        stamp_arrival()

    def leave(self, key: str = ANY_KEY) -> None:
        self._admission.leave(key)

    def refused(self, endpoint: str, error: GatewayError) -> None:
        """Count a request refused before it was classified (its body or its model)."""
        if self._telemetry is not None:
            self._telemetry.request_refused(endpoint, error)

    @contextmanager
    def _refusing(self, endpoint: str) -> Iterator[None]:
        """Checks before a request is classified: what they refuse is counted unclassified
        and takes no class's decision."""
        try:
            yield
        except GatewayError as exc:
            self.refused(endpoint, exc)
            raise

    async def _served(self, request: SampledRequest) -> None:
        """The model the request names is served (the backend's own check, first, as
        vLLM's serving runs it): an unknown model is refused before it is classified."""
        try:
            await self._frontend.check_model(request)
        except EngineError as exc:
            raise from_engine(exc) from None

    async def chat(
        self, request: ChatCompletionRequest, tenant: Tenant = UNLIMITED_ANONYMOUS
    ) -> JsonReply | StreamReply:
        with self._refusing("chat"):
            await self._served(request)
            report = requested_level(request, self._settings.speculation_report)
            messages, view = chat_intake(request, self._frontend.harmony_messages, self._settings)
            planned, tokens = self._plan_chat_view(view, messages, request)
        asked = request.max_completion_tokens or _chat_max_tokens(request)
        return await self._run(
            "chat",
            "chatcmpl-",
            planned,
            lambda gid: self._frontend.chat(
                request, k=planned.engine_k, gateway_id=gid, cap=planned.cap, step=planned.step
            ),
            request,
            tenant=tenant,
            reserve=tokens + self._max_tokens(asked),
            report=report,
        )

    async def responses(
        self, request: ResponsesRequest, tenant: Tenant = UNLIMITED_ANONYMOUS
    ) -> JsonReply | StreamReply:
        """`/v1/responses`, checked and classified as the chat request it renders to
        (`gateway.responses_request`)."""
        with self._refusing("responses"):
            await self._served(request)
            report = requested_level(request, self._settings.speculation_report)
            limits.reject_reserved_xargs(request.vllm_xargs, RESERVED_XARGS)
            refuse_unserved(request)
            # Never kept: vLLM's opt-in store holds every response in memory for good.
            request.store = False
            messages, view = chat_reading(request)
            limits.check_chat({"messages": messages, "stop": request.stop}, self._settings)
            text_format = text_format_schema(request)
            if text_format is not None:
                limits.check_schema(text_format, "text.format", self._settings)
            planned, tokens = self._plan_chat_view(view, messages, request)
        return await self._run(
            "responses",
            "resp_",
            planned,
            lambda gid: self._frontend.responses(
                request, k=planned.engine_k, gateway_id=gid, cap=planned.cap, step=planned.step
            ),
            request,
            tenant=tenant,
            reserve=tokens + self._max_tokens(request.max_output_tokens),
            report=report,
            engine_suffix="_0",  # vLLM's first (and, without built-in tools, only) sub-request
        )

    def _plan_chat_view(
        self,
        view: dict[str, Any],
        messages: list[dict[str, Any]],
        request: ChatCompletionRequest | ResponsesRequest,
    ) -> tuple[PlannedRequest, int]:
        """The tool limits, then the plan of a chat-shaped request, and its prompt's
        approximate tokens."""
        check_tools(view["tools"], self._settings)
        chars = sum(len(str(m.get("content") or "")) for m in messages)
        if view["tools"]:
            # The chat template renders the tool definitions into the prompt, so a tool-call
            # request's prompt is mostly its schemas: they count in its length bucket and in
            # its token reserve.
            chars += len(json.dumps(view["tools"], separators=(",", ":"), default=str))
        tokens = approx_tokens(chars)
        sampling = sampling_bucket(self._frontend.temperature_of(request))
        admission = self._admission
        planned = self._plane.plan_chat(
            view,
            tokens,
            running=admission.running,
            queued=admission.queued,
            sampling=sampling,
            unserved=unserved_by_drafts(request.logit_bias, self._frontend.min_p_of(request)),
        )
        return self._exact(planned, sampling), tokens

    async def completion(
        self, request: CompletionRequest, tenant: Tenant = UNLIMITED_ANONYMOUS
    ) -> JsonReply | StreamReply:
        with self._refusing("completions"):
            await self._served(request)
            report = requested_level(request, self._settings.speculation_report)
            text = completion_intake(request, self._settings)
        tokens = approx_tokens(len(text))
        sampling = sampling_bucket(self._frontend.temperature_of(request))
        admission = self._admission
        planned = self._plane.plan_completion(
            text,
            tokens,
            running=admission.running,
            queued=admission.queued,
            sampling=sampling,
            unserved=unserved_by_drafts(request.logit_bias, self._frontend.min_p_of(request)),
        )
        planned = self._exact(planned, sampling)
        return await self._run(
            "completions",
            "cmpl-",
            planned,
            lambda gid: self._frontend.completion(
                request, k=planned.engine_k, gateway_id=gid, cap=planned.cap, step=planned.step
            ),
            request,
            tenant=tenant,
            reserve=tokens + self._max_tokens(request.max_tokens),
            report=report,
            engine_suffix="-0",  # vLLM runs prompt i of a completion as `cmpl-<id>-<i>`
        )

    def _max_tokens(self, asked: int | None) -> int:
        """Completion tokens a request may use, as its key's tokens-per-minute reserve it."""
        return asked if asked else self._settings.tenants.default_max_tokens

    async def _run(
        self,
        endpoint: str,
        id_prefix: str,
        planned: PlannedRequest,
        call: PortCall,
        request: SampledRequest,
        *,
        tenant: Tenant = UNLIMITED_ANONYMOUS,
        reserve: int = 0,
        report: ReportLevel = "summary",
        engine_suffix: str = "",
    ) -> JsonReply | StreamReply:
        """Admit the planned request, then serve it as one `Exchange`. `request`, the
        parsed body, gives the inference span its sampling parameters; `reserve` is what
        the request may cost its `tenant` in tokens (prompt + max_tokens); `report` is its
        speculation report's level; the engine runs it as `id_prefix + gid + engine_suffix`."""
        plan = planned.plan
        # The engine keeps one acceptance estimator per class (`engine.vllm.confidence_budget`).
        request.vllm_xargs = {**(request.vllm_xargs or {}), SPEC_CLASS_ARG: plan.class_id}
        headers = planned.headers()
        gid = uuid.uuid4().hex
        clock = RequestClock.start()
        telemetry = self._telemetry
        shed = None if telemetry is None else lambda exc: telemetry.request_shed(endpoint, exc)
        grant = await admit(self._limiter, self._admission, tenant, reserve, plan.class_id, shed)
        headers.update(grant.headers)
        clock.admit()
        stream = bool(request.stream)
        exchange = Exchange(
            self._settlement,
            endpoint=endpoint,
            gid=gid,
            engine_id=id_prefix + gid + engine_suffix,
            planned=planned,
            grant=grant,
            span=self._spans.start(
                endpoint, self.served_model_name, request, plan, id_prefix + gid, stream
            ),
            clock=clock,
            report=SpeculationReport(report, plan),
            stream=stream,
        )
        return await exchange.serve(call, headers)
