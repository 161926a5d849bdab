"""The inference service: intake -> plan k -> key limits and admission -> an `Exchange`.

Routes stay thin (parse, call this, pick JSON or SSE). The control plane plans each request
and owns its life in the batch; each admitted request is one `gateway.exchange.Exchange`,
which serves it through the port and ends it once (its outcome and telemetry reported).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager

from opentelemetry.trace import Tracer

from engine.interface import SPEC_CLASS_ARG, EngineError, EngineStep
from engine.port import SampledRequest, ServingPort
from engine.protocol import ChatCompletionRequest, CompletionRequest, ResponsesRequest
from gateway.admission import ANY_KEY, Admission
from gateway.control.features import ChatView, sampling_bucket, unserved_by_drafts
from gateway.control.plane import ControlPlane, PlannedRequest
from gateway.errors import GatewayError, from_engine
from gateway.exchange import Exchange, PortCall, Settlement
from gateway.intake import (
    approx_tokens,
    chat_intake,
    chat_max_tokens,
    chat_tokens,
    completion_intake,
)
from gateway.observability.inference_span import InferenceSpans
from gateway.replies import JsonReply, StreamReply, Telemetry
from gateway.request_clock import RequestClock, stamp_arrival
from gateway.responses_request import responses_intake
from gateway.settings import GatewaySettings
from gateway.speculation_report import ReportLevel, SpeculationReport, requested_level
from gateway.tenants import KeyLimiter, Tenant
from gateway.tenants.admit import admit
from gateway.tenants.directory import UNLIMITED_ANONYMOUS


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

    @property
    def in_flight(self) -> int:
        """Requests admitted and not yet ended."""
        return len(self._inflight)

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
            view = chat_intake(request, self._frontend.harmony_messages, self._settings)
            planned, tokens = self._plan_chat(view, request)
        asked = request.max_completion_tokens or chat_max_tokens(request)
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
            view = responses_intake(request, self._settings)
            planned, tokens = self._plan_chat(view, request)
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

    def _plan_chat(
        self, view: ChatView, request: ChatCompletionRequest | ResponsesRequest
    ) -> tuple[PlannedRequest, int]:
        """The plan of a chat-shaped request, and its prompt's approximate tokens."""
        tokens = chat_tokens(view)
        sampling, unserved = self._sampling(request)
        admission = self._admission
        planned = self._plane.plan_chat(
            view,
            tokens,
            running=admission.running,
            queued=admission.queued,
            sampling=sampling,
            unserved=unserved,
        )
        return planned, tokens

    def _sampling(self, request: SampledRequest) -> tuple[str, str]:
        """The request's sampling bucket ("" when greedy) and why it must not draft ("":
        it may), from how the backend will sample it (`ServingPort.sampling_of`)."""
        sampling = self._frontend.sampling_of(request)
        bucket = sampling_bucket(sampling.temperature)
        return bucket, unserved_by_drafts(
            request.logit_bias, sampling.min_p, bucket, sampling.lossless
        )

    async def completion(
        self, request: CompletionRequest, tenant: Tenant = UNLIMITED_ANONYMOUS
    ) -> JsonReply | StreamReply:
        with self._refusing("completions"):
            await self._served(request)
            report = requested_level(request, self._settings.speculation_report)
            text = completion_intake(request, self._settings)
        tokens = approx_tokens(len(text))
        sampling, unserved = self._sampling(request)
        admission = self._admission
        planned = self._plane.plan_completion(
            text,
            tokens,
            running=admission.running,
            queued=admission.queued,
            sampling=sampling,
            unserved=unserved,
        )
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
