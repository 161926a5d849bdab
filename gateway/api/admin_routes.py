"""The admin API (admin-scope key only): what the controller knows, per class."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse

from gateway.api.deps import require_admin

router = APIRouter(prefix="/admin", dependencies=[Depends(require_admin)])


@router.get("/classes")
async def classes(request: Request) -> JSONResponse:
    """Each class: label, samples, acceptance length, depth profile, k, last change, drift."""
    runtime = request.app.state.runtime
    rows = runtime.class_report() if runtime is not None else []
    return JSONResponse({"object": "list", "data": rows})


@router.get("/costs")
async def costs(request: Request) -> JSONResponse:
    """The step-cost model per batch bucket (relative cost of each k) and its calibration."""
    runtime = request.app.state.runtime
    report = runtime.cost_report() if runtime is not None else {}
    return JSONResponse({"object": "cost_model", **report})
