"""Liveness, readiness and metrics: what Kubernetes and Prometheus call."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

router = APIRouter()


@router.get(
    "/health",
    responses={503: {"description": "The engine core is dead, or hung past the bound"}},
)
async def health(request: Request) -> JSONResponse:
    """Liveness: the process serves HTTP and the engine core is alive (even if busy) and
    not hung for longer than `liveness_hung_s`: a core that stopped answering is not
    restarted in process (vLLM offers no way to abandon a wedged core and its workers
    cleanly), so the orchestrator restarts the replica."""
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None:
        return JSONResponse({"status": "starting"})
    status, detail = await runtime.liveness()
    if status != "ok":
        return JSONResponse({"status": status, "detail": detail}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/ready", responses={503: {"description": "Not ready; `detail` says why"}})
async def ready(request: Request) -> JSONResponse:
    """Readiness: warmed up, not draining, and the engine makes progress on admitted work."""
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None:
        return JSONResponse({"ready": False, "detail": {"engine": "starting"}}, status_code=503)
    report = await runtime.readiness()
    return JSONResponse(report, status_code=200 if report["ready"] else 503)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request) -> Response:
    body, content_type = request.app.state.render_metrics()
    return Response(body, media_type=content_type)
