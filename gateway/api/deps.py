"""FastAPI dependencies: typed access to the app's runtime, and the key scopes.

All `async def` although none awaits: FastAPI runs a plain `def` dependency in its
thread pool, two thread hops per request that cost more than the checks themselves.
"""

from __future__ import annotations

from typing import Any

from fastapi import Request

from gateway.auth import Scope
from gateway.phase import not_ready
from gateway.service import InferenceService
from gateway.tenants import Tenant


async def require_user(request: Request) -> None:
    if getattr(request.state, "tenant", None) is not None:
        return  # the edge gate checked this request's key for the user scope already
    request.app.state.keyring.check(request.headers.get("authorization"), Scope.USER)


async def require_admin(request: Request) -> None:
    request.app.state.keyring.check(request.headers.get("authorization"), Scope.ADMIN)


async def tenant(request: Request) -> Tenant:
    """The request's key as limits and fair shares see it (the gate resolved it already
    where it ran)."""
    found: Tenant | None = getattr(request.state, "tenant", None)
    if found is None:
        found = request.app.state.tenants.identify(request.headers.get("authorization"))
    return found


async def service(request: Request) -> InferenceService:
    svc: InferenceService = (await ready_runtime(request)).service
    return svc


async def ready_runtime(request: Request) -> Any:
    """The runtime, or 503 `not_ready` (saying the phase) while loading, restarting or
    draining."""
    runtime = getattr(request.app.state, "runtime", None)
    if runtime is None or not runtime.ready:
        raise not_ready(request.app.state.phases)
    return runtime
