"""The inference service: intake -> plan k -> key limits and admission -> the serving port.

Routes stay thin (parse, call this, pick JSON or SSE). The control plane plans each request
and owns its life in the batch; on the way out its outcome and telemetry are reported.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import Tracer

from engine.interface import SPEC_CLASS_ARG, EngineError, EngineStep, RequestOutcome
from engine.port import RESERVED_XARGS, SampledRequest, ServingPort
from engine.protocol import ChatCompletionRequest, CompletionRequest, ResponsesRequest
from gateway import limits
from gateway.admission import ANY_KEY, Admission
from gateway.control.features import sampling_bucket, unserved_by_drafts
from gateway.control.plane import ControlPlane, Plan, PlannedRequest
from gateway.errors import GatewayError, from_engine
from gateway.intake import approx_tokens, chat_intake, check_tools, completion_intake
from gateway.observability.inference_span import UNTRACED, InferenceSpan, InferenceSpans
from gateway.outcomes import OutcomeBoard
from gateway.replies import (
    SAMPLED_NOT_EXACT,
    Finished,
    JsonReply,
    StreamReply,
    Telemetry,
    engine_reply,
    whole_answer,
)
from gateway.request_clock import RequestClock, stamp_arrival
from gateway.responses_request import chat_reading, refuse_unserved, text_format_schema
from gateway.responses_stream import relay_for
from gateway.settings import GatewaySettings
from gateway.speculation_report import ReportLevel, SpeculationReport, requested_level
from gateway.streaming import StreamEnd
from gateway.tenants import Grant, KeyLimiter, Tenant
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
        board: OutcomeBoard,
        admission: Admission,
        telemetry: Telemetry | None = None,
        limiter: KeyLimiter | None = None,
    ) -> None:
        self._settings = settings
        self._limiter = limiter
        #: gateway id -> the request's hold on its key's limits, until it leaves the engine.
        self._grants: dict[str, Grant] = {}
        self._frontend = frontend
        self._plane = plane
        self._board = board
        self._admission = admission
        self._telemetry = telemetry
        #: gateway id -> the engine's request id, for aborting at the drain deadline.
        self._inflight: dict[str, str] = {}
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
        ids = list(self._inflight.values())
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
            bool(request.stream),
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
            bool(request.stream),
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
            bool(request.stream),
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
        stream: bool,
        call: Callable[[str], Awaitable[Any]],
        request: Any = None,
        *,
        tenant: Tenant = UNLIMITED_ANONYMOUS,
        reserve: int = 0,
        report: ReportLevel = "summary",
        engine_suffix: str = "",
    ) -> JsonReply | StreamReply:
        """`request`, the parsed body, gives the inference span its sampling parameters;
        `reserve` is what the request may cost its `tenant` in tokens (prompt + max_tokens);
        `report` is its speculation report's level; the engine runs it as
        `id_prefix + gateway id + engine_suffix`."""
        plan = planned.plan
        if request is not None and hasattr(request, "vllm_xargs"):
            # The engine keeps one acceptance estimator per class (`engine.vllm.confidence_budget`).
            request.vllm_xargs = {**(request.vllm_xargs or {}), SPEC_CLASS_ARG: plan.class_id}
        spec_report = SpeculationReport(report, plan)
        headers = planned.headers()
        gid = uuid.uuid4().hex
        started = RequestClock.start()
        telemetry = self._telemetry
        shed = None if telemetry is None else lambda exc: telemetry.request_shed(endpoint, exc)
        grant = await admit(self._limiter, self._admission, tenant, reserve, plan.class_id, shed)
        self._grants[gid] = grant
        headers.update(grant.headers)
        started.admit()
        span = self._spans.start(
            endpoint, self.served_model_name, request, plan, id_prefix + gid, stream
        )
        planned.enter()
        released = False
        try:
            self._board.expect(gid)
            self._inflight[gid] = id_prefix + gid + engine_suffix
            result = await engine_reply(call, gid, span)
            if not stream:
                body, outcome = await whole_answer(self._board.wait, gid, spec_report, result)
                released = True
                self._release(gid, planned, outcome, span)
                self._report(endpoint, plan, "complete", None, outcome, started, None, False, span)
                return JsonReply(body, headers)
            released = True  # by the stream's end
            return self._stream(endpoint, planned, gid, result, headers, started, spec_report, span)
        except GatewayError as exc:
            if not released:
                released = True
                self._release(gid, planned, None, span)
            exc.headers.update(grant.headers)
            self._report(endpoint, plan, "error", exc, None, started, None, stream, span)
            raise
        except BaseException as exc:
            span.interrupted(exc)
            raise
        finally:
            if not released:
                self._release(gid, planned, None, span)

    def _release(
        self,
        gid: str,
        planned: PlannedRequest,
        outcome: RequestOutcome | None,
        span: InferenceSpan = UNTRACED,
    ) -> None:
        """The request has left the engine: its admission slot, board entry and batch;
        a complete request's outcome goes to the control plane (whose decision changes
        and drifts become events of the request's span)."""
        grant = self._grants.pop(gid, None)
        self._admission.release(grant.tenant.key if grant is not None else ANY_KEY)
        if grant is not None and self._limiter is not None:
            used = outcome.prompt_tokens + outcome.output_tokens if outcome is not None else None
            self._limiter.settle(grant, used)  # unknown use (no outcome): the reservation stays
        self._board.discard(gid)
        self._inflight.pop(gid, None)
        with span.current():
            planned.finish(outcome)

    def _stream(
        self,
        endpoint: str,
        planned: PlannedRequest,
        gid: str,
        source: AsyncIterator[str],
        headers: dict[str, str],
        started: RequestClock,
        spec_report: SpeculationReport,
        span: InferenceSpan = UNTRACED,
    ) -> StreamReply:
        plan = planned.plan
        done = False

        async def finalize(end: StreamEnd | None = None) -> None:
            nonlocal done
            if done:
                return
            done = True
            end = end or StreamEnd()
            outcome = self._board.peek(gid)
            self._release(gid, planned, outcome if end.status == "complete" else None, span)
            self._report(
                endpoint,
                plan,
                end.status,
                end.error,
                outcome,
                started,
                None if end.first_chunk_at is None else end.first_chunk_at - started.arrived,
                True,
                span,
            )

        async def report(body: dict[str, Any]) -> dict[str, Any]:
            return spec_report.write(body, await self._board.wait(gid, 1.0))

        def aborted() -> bool:
            outcome = self._board.peek(gid)
            return outcome is not None and outcome.finish_reason == "abort"

        chunks = relay_for(
            endpoint,
            source,
            idle_timeout_s=self._settings.stream_idle_timeout_s,
            report=report,
            aborted=aborted,
            on_end=finalize,
        )
        return StreamReply(chunks, headers, finalize)

    def _report(
        self,
        endpoint: str,
        plan: Plan,
        status: str,
        error: GatewayError | None,
        outcome: RequestOutcome | None,
        started: RequestClock,
        ttft_s: float | None,
        stream: bool,
        span: InferenceSpan = UNTRACED,
    ) -> None:
        finished = Finished(
            endpoint=endpoint,
            plan=plan,
            status=status,
            error=error,
            outcome=outcome,
            e2e_s=started.since_queued_s(),
            ttft_s=ttft_s,
            stream=stream,
            clock=started,
        )
        span.finish(finished)
        if self._telemetry is not None:
            self._telemetry.request_finished(finished)
