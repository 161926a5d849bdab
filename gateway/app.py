"""The composition root: `create_app(settings, runtime_factory)` builds everything.

No module-level app and no globals: the engine, the controller, admission and
telemetry live in one `Runtime` whose lifetime is the app's lifespan (an async
context manager that always shuts the engine down), reached through typed
dependencies.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from engine.protocol import ClientError
from gateway.api import admin_routes, openai_routes, ops_routes
from gateway.api.deps import require_admin
from gateway.api.gate import GATED, AdmissionGate
from gateway.api.responses import error_docs, error_response
from gateway.auth import KeyRing
from gateway.connections import EdgeStats
from gateway.errors import ErrorKind, GatewayError
from gateway.flags import FlagAdmin, FlagView
from gateway.flags.admin_routes import build_flags_router
from gateway.observability.edge_metrics import edge_registry, render_alone, with_edge
from gateway.observability.logs import request_context
from gateway.observability.tracing import TRACER_NAME, setup_tracing
from gateway.phase import Phase, PhaseBoard, not_ready, starting
from gateway.settings import GatewaySettings
from gateway.tenants import TenantDirectory
from gateway.tenants.decision import RATELIMIT_HEADERS

log = logging.getLogger("specgw")

RuntimeFactory = Callable[[GatewaySettings], AbstractAsyncContextManager[Any]]

_SAFE_ID = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:")


class RequestEdge:
    """Pure ASGI middleware: `x-request-id` on every response, and the body-size limit.

    A client's own `x-request-id` is propagated when it is short and plain;
    otherwise a fresh one is minted. The body is read here, up to
    `max_body_bytes`, and replayed to the app: a larger one (declared or chunked)
    gets 413 before the rest is read, and before any JSON parsing; one that has not
    arrived whole `body_timeout_s` after its headers gets 408 and the connection
    closes (uvicorn bounds no body read; the headers' own deadline is
    `gateway.connections`).
    """

    def __init__(
        self,
        app: ASGIApp,
        max_body_bytes: int,
        body_timeout_s: float = 30.0,
        stats: EdgeStats | None = None,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.stats = stats or EdgeStats()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid, declared = "", -1
        for name, value in scope["headers"]:
            if name == b"x-request-id":
                rid = value.decode("latin-1")
            elif name == b"content-length" and value.isdigit():
                declared = int(value)
        if not rid or len(rid) > 128 or not set(rid) <= _SAFE_ID:
            rid = uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        with request_context(rid):  # every log line of the request carries its id
            await self._serve(scope, receive, send, rid, declared)

    async def _serve(
        self, scope: Scope, receive: Receive, send: Send, rid: str, declared: int
    ) -> None:
        header = (b"x-request-id", rid.encode("latin-1"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), header]
            await send(message)

        if declared > self.max_body_bytes:
            await self._too_large(scope, receive, send_with_id)
            return
        try:
            async with asyncio.timeout(self.body_timeout_s):
                reads = scope["method"] in ("POST", "PUT")
                body = await self._read_body(receive) if reads else b""
        except TimeoutError:
            self.stats.body_timeouts += 1
            await self._late(scope, receive, send_with_id)
            return
        if body is None:
            await self._too_large(scope, receive, send_with_id)
            return
        replayed = False
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send_with_id(message)

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # later calls: http.disconnect when the client leaves

        try:
            await self.app(scope, replay, send_tracked)
        except Exception as exc:
            if started:
                raise
            error = unexpected_error(exc, scope.get("state", {}))
            if error.kind is ErrorKind.INVALID_REQUEST:
                count_refused(scope, error)
            await error_response(error)(scope, replay, send_with_id)

    async def _read_body(self, receive: Receive) -> bytes | None:
        """The whole body, or None as soon as it exceeds the limit."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return b"".join(chunks)
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _late(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = GatewayError(
            ErrorKind.REQUEST_TIMEOUT,
            f"request body not sent in {self.body_timeout_s} s",
            headers={"connection": "close"},
        )
        count_refused(scope, error)
        await error_response(error)(scope, receive, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        error = GatewayError(
            ErrorKind.PAYLOAD_TOO_LARGE, f"request body over {self.max_body_bytes} bytes"
        )
        count_refused(scope, error)
        await error_response(error)(scope, receive, send)


def count_refused(scope: Scope, error: GatewayError) -> None:
    """An inference request refused before it was classified (its body: too large, too
    slow, not parsed) counts as `unclassified` with its status, as the service counts
    the refusals it makes itself (`InferenceService.refused`)."""
    endpoint = GATED.get(scope.get("path", "")) if scope.get("method") == "POST" else None
    runtime = getattr(getattr(scope.get("app"), "state", None), "runtime", None)
    if endpoint is not None and runtime is not None and runtime.ready:
        runtime.service.refused(endpoint, error)


def unexpected_error(exc: Exception, state: dict[str, Any]) -> GatewayError:
    """The closed-set error for an exception no handler took (always with x-request-id).

    vLLM's protocol models raise TypeError / VLLMValidationError straight out of
    their before-validators while the body is parsed: that is the request's
    fault (400). Anything after the route was entered is the gateway's (500).
    """
    if not state.get("route_entered") and isinstance(exc, TypeError | ValueError | ClientError):
        return GatewayError(ErrorKind.INVALID_REQUEST, str(exc))
    log.error("unhandled error", exc_info=exc, extra={"request_id": state.get("request_id")})
    return GatewayError(ErrorKind.ENGINE_ERROR, "internal error")


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def on_gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        loc = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = str(first.get("msg", "invalid request"))
        param = ".".join(loc) or None
        text = f"{param}: {message}" if param else message
        error = GatewayError(ErrorKind.INVALID_REQUEST, text, param=param)
        count_refused(request.scope, error)
        return error_response(error)

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = {
            404: ErrorKind.NOT_FOUND,
            413: ErrorKind.PAYLOAD_TOO_LARGE,
        }.get(exc.status_code, ErrorKind.INVALID_REQUEST)
        headers = dict(exc.headers or {})
        methods = _methods_of(request) if exc.status_code == 405 else []
        if methods:
            # RFC 9110 section 15.5.6: `allow` lists every method of the resource; Starlette's
            # names only the first route it tried (PUT of PUT and DELETE /admin/flags/{flag}).
            headers = {"allow": ", ".join(methods)}
        error = GatewayError(kind, str(exc.detail), headers=headers)
        response = error_response(error)
        response.status_code = exc.status_code
        return response


def _methods_of(request: Request) -> list[str]:
    """Methods of every route with the path template of the route that answered 405."""
    endpoint = request.scope.get("endpoint")
    routes = [r for r in request.app.routes if isinstance(r, APIRoute)]
    paths = {r.path for r in routes if r.endpoint is endpoint}
    return sorted({m for r in routes if r.path in paths for m in r.methods if m != "HEAD"})


def _flag_admin(app: FastAPI) -> FlagAdmin:
    runtime = app.state.runtime
    if runtime is None:
        raise not_ready(app.state.phases)
    admin = getattr(runtime, "flag_admin", None)
    if admin is None:
        raise GatewayError(
            ErrorKind.NOT_READY,
            "Flag overrides need Redis: set SPECGW_REDIS_URL.",
            retry_after_s=60,
        )
    return admin  # type: ignore[no-any-return]


def _flag_view(app: FastAPI) -> FlagView | None:
    return getattr(app.state.runtime, "flag_view", None)


def create_app(settings: GatewaySettings, runtime_factory: RuntimeFactory) -> FastAPI:
    """The app; its lifespan builds the runtime (`runtime_factory(settings)`) and publishes
    it as `app.state.runtime` once ready, reporting the start-up on `app.state.phases`.

    Until then the routes answer: `/health` 200, `/ready` 503 with the phase, `/metrics`
    the app's own families, the OpenAI routes 503 `not_ready` with `retry-after`.
    `spec-gateway serve` binds its port first and runs this lifespan's start-up in the
    background (`gateway.server`); in process, entering the lifespan returns a ready app.
    """
    settings.check_exposure()
    phases = PhaseBoard()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        phases.begin("starting the engine")
        try:
            with starting(phases):
                runtime_context = runtime_factory(settings)
                runtime = await runtime_context.__aenter__()
        except BaseException:
            phases.enter(Phase.DRAINING, "start-up did not finish")
            raise
        try:
            app.state.runtime = runtime
            app.state.render_metrics = with_edge(runtime.render_metrics, edges)
            if tracer is not None and hasattr(runtime, "service"):
                runtime.service.trace_with(tracer.get_tracer(TRACER_NAME))
            phases.enter(Phase.READY)
            yield
        finally:
            phases.enter(Phase.DRAINING, "shutting down")
            app.state.runtime = None
            app.state.render_metrics = render_alone(edges)
            try:
                await runtime_context.__aexit__(None, None, None)
            finally:
                if tracer is not None:
                    tracer.shutdown()

    app = FastAPI(
        title="spec-gateway",
        version="0.1.0",
        description="OpenAI-compatible gateway that sets the speculative-decoding depth "
        "per request class from live acceptance.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.runtime = None
    app.state.phases = phases
    app.state.keyring = KeyRing(settings.api_keys, settings.admin_keys)
    app.state.tenants = TenantDirectory(settings.tenants, settings.api_keys)
    _install_error_handlers(app)
    app.include_router(ops_routes.router)
    app.include_router(openai_routes.router)
    app.include_router(admin_routes.router, responses=error_docs(401, 403))
    app.include_router(
        build_flags_router(lambda: _flag_admin(app), require_admin, lambda: _flag_view(app)),
        responses=error_docs(400, 401, 403, 503),
    )
    tracer = setup_tracing(settings, app)
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["authorization", "content-type", "x-request-id"],
            expose_headers=["x-request-id", "x-specgw-class", "x-specgw-k", *RATELIMIT_HEADERS],
        )
    app.add_middleware(AdmissionGate)  # inside RequestEdge: its 429s carry x-request-id
    app.state.edge_stats = EdgeStats()  # the server's protocol counts into it too
    edges = edge_registry(app.state.edge_stats, phases)
    app.state.render_metrics = render_alone(edges)
    app.add_middleware(
        RequestEdge,
        max_body_bytes=settings.max_body_bytes,
        body_timeout_s=settings.body_timeout_s,
        stats=app.state.edge_stats,
    )
    return app
