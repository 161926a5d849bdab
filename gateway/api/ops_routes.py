"""Liveness, readiness and metrics: what Kubernetes and Prometheus call.

Both probes carry the replica's phase (`gateway.phase`): the port is bound while the
engine loads, so a start-up or an in-process restart is watched, not waited out.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from gateway.phase import Phase, PhaseBoard

router = APIRouter()


@router.get(
    "/health",
    responses={503: {"description": "The engine core is dead, or hung past the bound"}},
)
async def health(request: Request) -> JSONResponse:
    """Liveness: the process serves HTTP, and outside a restart the engine core is alive
    (even if busy) and not hung for longer than `liveness_hung_s`: a core that stopped
    answering is not restarted in process (vLLM offers no way to abandon a wedged core
    and its workers cleanly), so the orchestrator restarts the replica. While the engine
    loads, calibrates or is being replaced by the supervisor, the process is healthy:
    200 with the phase."""
    phases: PhaseBoard = request.app.state.phases
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None or phases.phase is Phase.RESTARTING:
        return JSONResponse({"status": "ok", "phase": phases.phase.value})
    status, detail = await runtime.liveness()
    if status != "ok":
        body = {"status": status, "phase": phases.phase.value, "detail": detail}
        return JSONResponse(body, status_code=503)
    return JSONResponse({"status": "ok", "phase": phases.phase.value})


@router.get(
    "/ready",
    responses={503: {"description": "Not ready; `phase`, `progress` and `detail` say why"}},
)
async def ready(request: Request) -> JSONResponse:
    """Readiness: in the `ready` phase, warmed up, not draining, and the engine makes
    progress on admitted work. The body: `ready`, `phase`, `progress` (the phase's
    `done`/`total`, or null) and `detail` (the engine's and the shared state's)."""
    phases: PhaseBoard = request.app.state.phases
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None:
        body: dict[str, Any] = {"ready": False, **phases.report(), "detail": {"engine": "starting"}}
        return JSONResponse(body, status_code=503)
    report = await runtime.readiness()
    ready = bool(report["ready"]) and phases.phase is Phase.READY
    body = {"ready": ready, **phases.report(), "detail": report.get("detail", {})}
    return JSONResponse(body, status_code=200 if ready else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    body, content_type = request.app.state.render_metrics()
    return Response(body, media_type=content_type)
