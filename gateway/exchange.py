"""One admitted request, from the serving port's call to its one end.

An `Exchange` holds what a request needs once it is admitted: its endpoint and gateway
id, its key's grant, its plan (`PlannedRequest`), its span and clock, its speculation
report, and what the port answered (`Served`: the reply and the engine's outcome).
`serve` calls the port and returns the whole answer or the relayed stream; `end` is
the request's one end, however it comes (a whole answer, the stream's terminal state,
an error, the client leaving): it settles the admission slot and the key's tokens,
finishes the plan (the controller learns from a complete request's outcome) and
reports once; a later call does nothing.

The outcome is read, never waited for: the port resolves it before the reply's last
chunk is produced (`engine.port`), so a whole answer and a stream's final usage chunk
or `response.completed` find it there. One still pending at the end broke that
promise, or belongs to a stream that was never read (the engine never saw the
request): it counts as no outcome and is cancelled, which frees the engine's entry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from engine.interface import RequestOutcome
from engine.outcomes import Served
from gateway.admission import Admission
from gateway.control.plane import PlannedRequest
from gateway.errors import GatewayError
from gateway.observability.inference_span import InferenceSpan
from gateway.replies import Finished, JsonReply, StreamReply, Telemetry, engine_reply, whole_answer
from gateway.request_clock import RequestClock
from gateway.responses_stream import relay_for
from gateway.speculation_report import SpeculationReport
from gateway.streaming import StreamEnd
from gateway.tenants import Grant, KeyLimiter

#: The port's answering call, given the gateway id.
PortCall = Callable[[str], Awaitable[Served[Any]]]


@dataclass(frozen=True, slots=True)
class Settlement:
    """What every exchange ends against: the admission it leaves, the key limits it
    settles, the telemetry it reports to, its streams' idle bound, and the exchanges in
    flight (the drain deadline aborts them)."""

    admission: Admission
    limiter: KeyLimiter | None
    telemetry: Telemetry | None
    idle_timeout_s: float
    inflight: dict[str, Exchange]


class Exchange:
    """One admitted request: `serve` it, then `end` it once."""

    __slots__ = (
        "_ended",
        "_first_chunk_at",
        "_settlement",
        "clock",
        "endpoint",
        "engine_id",
        "gid",
        "grant",
        "planned",
        "report",
        "served",
        "span",
        "stream",
    )

    def __init__(
        self,
        settlement: Settlement,
        *,
        endpoint: str,
        gid: str,
        engine_id: str,
        planned: PlannedRequest,
        grant: Grant,
        span: InferenceSpan,
        clock: RequestClock,
        report: SpeculationReport,
        stream: bool,
    ) -> None:
        """`engine_id`: the engine's request id (what an abort names)."""
        self._settlement = settlement
        self.endpoint = endpoint
        self.gid = gid
        self.engine_id = engine_id
        self.planned = planned
        self.grant = grant
        self.span = span
        self.clock = clock
        self.report = report
        self.stream = stream
        self.served: Served[Any] | None = None
        self._ended = False
        self._first_chunk_at: float | None = None

    async def serve(self, call: PortCall, headers: dict[str, str]) -> JsonReply | StreamReply:
        """The request enters the engine batch and is answered: a whole answer (ended
        here) or the relayed stream (ended by its terminal state or its finalize)."""
        self.planned.enter()
        self._settlement.inflight[self.gid] = self
        try:
            self.served = await engine_reply(call, self.gid, self.span)
            if self.stream:
                return self._relay(headers)
            body = whole_answer(self.served.reply, self.report, self.outcome())
            await self.end("complete")
            return JsonReply(body, headers)
        except GatewayError as exc:
            exc.headers.update(self.grant.headers)
            await self.end("error", exc)
            raise
        except BaseException as exc:
            self.interrupted(exc)
            raise

    def outcome(self) -> RequestOutcome | None:
        """The engine's outcome of the request, if it came (read, never waited for)."""
        served = self.served
        if served is None or not served.outcome.done() or served.outcome.cancelled():
            return None
        return served.outcome.result()

    async def end(self, status: str, error: GatewayError | None = None) -> None:
        """The request's one end: `complete`, `error` (with the gateway's `error`) or
        `disconnected`. Only a complete request's outcome is learnt from and settles its
        key's tokens (an incomplete one's reservation stays)."""
        if self._ended:
            return
        outcome = self._close()
        complete = outcome if status == "complete" else None
        self._release(complete)
        first = self._first_chunk_at
        finished = Finished(
            endpoint=self.endpoint,
            plan=self.planned.plan,
            status=status,
            error=error,
            outcome=outcome,
            e2e_s=self.clock.since_queued_s(),
            ttft_s=None if first is None else first - self.clock.arrived,
            stream=self.stream,
            clock=self.clock,
        )
        self.span.finish(finished)
        telemetry = self._settlement.telemetry
        if telemetry is not None:
            telemetry.request_finished(finished)

    def interrupted(self, exc: BaseException) -> None:
        """Cut short by an exception outside the error set (the client's cancellation,
        a dead engine, a bug): released, its span ended with `exc`, nothing reported."""
        if self._ended:
            return
        self._close()
        self.span.interrupted(exc)
        self._release(None)

    def _close(self) -> RequestOutcome | None:
        """Mark the end; the outcome, a pending one cancelled (no outcome)."""
        self._ended = True
        self._settlement.inflight.pop(self.gid, None)
        outcome = self.outcome()
        if self.served is not None and not self.served.outcome.done():
            self.served.outcome.cancel()
        return outcome

    def _release(self, outcome: RequestOutcome | None) -> None:
        """Its admission slot and key's tokens back; its batch left, the controller
        told (its decision changes and drifts become events of the request's span)."""
        settlement, grant = self._settlement, self.grant
        settlement.admission.release(grant.tenant.key)
        if settlement.limiter is not None:
            used = outcome.prompt_tokens + outcome.output_tokens if outcome is not None else None
            settlement.limiter.settle(grant, used)  # unknown use (no outcome): it stays
        with self.span.current():
            self.planned.finish(outcome)

    def _relay(self, headers: dict[str, str]) -> StreamReply:
        assert self.served is not None
        chunks = relay_for(
            self.endpoint,
            self.served.reply,
            idle_timeout_s=self._settlement.idle_timeout_s,
            report=self._write_report,
            aborted=self._aborted,
            on_end=self._stream_ended,
        )
        return StreamReply(chunks, headers, self._abandoned)

    async def _write_report(self, body: dict[str, Any]) -> dict[str, Any]:
        """The stream's final usage chunk or `response.completed`, with the report."""
        return self.report.write(body, self.outcome())

    def _aborted(self) -> bool:
        outcome = self.outcome()
        return outcome is not None and outcome.finish_reason == "abort"

    async def _stream_ended(self, end: StreamEnd) -> None:
        self._first_chunk_at = end.first_chunk_at
        await self.end(end.status, end.error)

    async def _abandoned(self) -> None:
        """The response ended without the stream's end (it was never read to one)."""
        await self.end("disconnected")
