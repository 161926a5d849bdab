"""Admin HTTP routes for flags: thin wrappers over `FlagAdmin` (and `FlagView` to show effect).

`require_admin` is the app's dependency that checks the admin scope (the lead
passes `gateway.api.deps.require_admin`). The actor recorded in the audit log
is a fingerprint of the admin key (first 12 hex of its SHA-256, never the key)
plus the optional `x-specgw-actor` header the CLI fills with user@host.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, Request
from redis.exceptions import RedisError

from gateway.errors import ErrorKind, GatewayError
from gateway.flags.admin import AuditEntry, FlagAdmin
from gateway.flags.overrides import Target
from gateway.flags.values import FlagValue, FlagValueError
from gateway.flags.view import FlagView


def actor(request: Request) -> str:
    token = request.headers.get("authorization", "").partition(" ")[2]
    key = hashlib.sha256(token.encode()).hexdigest()[:12] if token else "anonymous"
    claimed = request.headers.get("x-specgw-actor", "").strip()[:128]
    return f"{claimed} (key {key})" if claimed else f"key {key}"


def build_flags_router(
    admin: Callable[[], FlagAdmin],
    require_admin: Callable[..., Any],
    view: Callable[[], FlagView | None] | None = None,
) -> APIRouter:
    """`/admin/flags` routes; `admin` / `view` return the app's instances (built in lifespan)."""
    router = APIRouter(prefix="/admin/flags", dependencies=[Depends(require_admin)])

    @router.get("")
    async def get_flags(
        flag: str | None = None,
        class_id: Annotated[str | None, Query(alias="class")] = None,
        label: str | None = None,
    ) -> dict[str, Any]:
        """Overrides in Redis, and the effective values for a class (or for all)."""
        overrides = await _call(admin().get(flag))
        out: dict[str, Any] = {"overrides": [asdict(o) for o in overrides]}
        current = view() if view is not None else None
        if current is not None:
            out["effective"] = asdict(current.overrides_for(class_id or "", label or ""))
        return out

    # Before `/{flag}`: the first route whose path matches answers a wrong method (405).
    @router.get("/audit")
    async def audit(count: Annotated[int, Query(ge=1, le=1000)] = 50) -> dict[str, Any]:
        entries = await _call(admin().audit(count))
        return {"object": "list", "data": [e.as_dict() for e in entries]}

    @router.put("/{flag}")
    async def set_flag(
        flag: str,
        request: Request,
        value: Annotated[FlagValue, Body(embed=True)],
        class_id: Annotated[str | None, Body(embed=True, alias="class")] = None,
        label: Annotated[str | None, Body(embed=True)] = None,
    ) -> dict[str, Any]:
        target = _target(class_id, label)
        entry: AuditEntry = await _call(admin().set(flag, value, who=actor(request), target=target))
        await _catch_up(view)
        return entry.as_dict()

    @router.delete("/{flag}")
    async def unset_flag(
        flag: str,
        request: Request,
        class_id: Annotated[str | None, Query(alias="class")] = None,
        label: str | None = None,
    ) -> dict[str, Any]:
        target = _target(class_id, label)
        entry: AuditEntry = await _call(admin().unset(flag, who=actor(request), target=target))
        await _catch_up(view)
        return entry.as_dict()

    return router


async def _catch_up(view: Callable[[], FlagView | None] | None) -> None:
    """After a write, this replica's view reads it back before the answer goes out."""
    current = view() if view is not None else None
    if current is not None:
        await current.catch_up()


def _target(class_id: str | None, label: str | None) -> Target:
    try:
        return Target.of(class_id, label)
    except ValueError as exc:
        raise GatewayError(ErrorKind.INVALID_REQUEST, str(exc), param="class") from exc


async def _call(awaitable: Any) -> Any:
    """Map the service's errors once: bad flag or value -> 400, Redis away -> 503."""
    try:
        return await awaitable
    except FlagValueError as exc:
        raise GatewayError(ErrorKind.INVALID_REQUEST, str(exc), param="value") from exc
    except (RedisError, OSError) as exc:
        raise GatewayError(
            ErrorKind.NOT_READY, f"flag store unavailable: {exc}", retry_after_s=2
        ) from exc
