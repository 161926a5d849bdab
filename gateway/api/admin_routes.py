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


@router.post("/prefix-cache/reset")
async def reset_prefix_cache(request: Request) -> JSONResponse:
    """Empty the engine's prefix cache, so that what runs next starts from cold prompts.

    For benchmarks that compare settings one after another on one engine (each
    should find the cache as the others did) and for operators after a change that
    makes cached blocks worthless. vLLM refuses while requests hold cached blocks:
    then `reset` is false and nothing was dropped.
    """
    runtime = request.app.state.runtime
    reset = bool(runtime is not None and await runtime.engine.reset_prefix_cache())
    return JSONResponse({"object": "prefix_cache", "reset": reset})


@router.get("/costs")
async def costs(request: Request) -> JSONResponse:
    """The step-cost model per batch bucket (relative cost of each k) and its calibration."""
    runtime = request.app.state.runtime
    report = runtime.cost_report() if runtime is not None else {}
    return JSONResponse({"object": "cost_model", **report})
