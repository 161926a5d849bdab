"""The edge gate: an overloaded gateway sheds an inference request before parsing it.

Pure ASGI, inside `RequestEdge` (so a shed answer carries `x-request-id`). For a
POST to an inference route with a valid user key, it takes the service's edge
ticket of its key (`InferenceService.enter`: fair shares between keys start
here) before FastAPI parses and validates the body,
and returns it just before the response's last frame, streams included (the
stream's admission slot is already free by then: the relay's end frees it). When the gateway
is full the request is answered 429 (503 while draining) at once.

Right after taking a ticket the request yields to the event loop once: the other
requests of a burst that arrived in the same loop iteration then reach the gate
(and are shed) before this one spends milliseconds in parsing and chat
rendering. Requests without a valid key, and all requests while no engine is
ready, pass through untouched: the app answers them 401/403/503 as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.responses import error_response
from gateway.auth import Scope as KeyScope
from gateway.errors import GatewayError
from gateway.tenants import Tenant

#: Inference routes and the endpoint names telemetry uses for them.
GATED = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
}


class AdmissionGate:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        endpoint = GATED.get(scope.get("path", "")) if scope["type"] == "http" else None
        state = scope["app"].state if endpoint is not None and "app" in scope else None
        runtime = getattr(state, "runtime", None)
        tenant = None
        if endpoint is not None and scope["method"] == "POST" and runtime is not None:
            tenant = _tenant(state, scope) if runtime.ready else None
        if tenant is None or runtime is None:
            await self.app(scope, receive, send)
            return
        # The route reads it back (`deps.tenant`): the key is hashed once per request.
        scope.setdefault("state", {})["tenant"] = tenant
        service = runtime.service
        try:
            service.enter(endpoint, tenant.key)
        except GatewayError as exc:
            await error_response(exc)(scope, receive, send)
            return
        inside = True

        def leave() -> None:
            nonlocal inside
            if inside:
                inside = False
                service.leave(tenant.key)

        async def send_then_leave(message: Message) -> None:
            # The ticket goes back before the last frame, not after the app returns: a
            # client that saw its response end may send the next request at once.
            if message["type"] == "http.response.body" and not message.get("more_body"):
                leave()
            await send(message)

        try:
            await asyncio.sleep(0)
            await self.app(scope, receive, send_then_leave)
        finally:
            leave()


def _tenant(state: Any, scope: Scope) -> Tenant | None:
    """The request's tenant if its key may call the inference API, else None."""
    authorization = None
    for name, value in scope["headers"]:
        if name == b"authorization":
            authorization = value.decode("latin-1")
            break
    try:
        presented = state.keyring.check(authorization, KeyScope.USER)
    except GatewayError:
        return None
    # `TenantDirectory.identify` on the digest the check computed: the key is hashed once.
    tenants = state.tenants
    if presented is None or tenants.open_access:
        tenant: Tenant = tenants.anonymous
    else:
        tenant = tenants.by_digest(presented)
    return tenant
