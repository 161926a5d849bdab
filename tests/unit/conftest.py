"""The whole gateway in process on the fake backend, driven by the official `openai` client.

`create_app(settings, runtime_factory(...))` is the production composition root on the
fake backend (`engine.fake_backend`: `FakeEngine` + `FakeFrontend`): the same routes, auth,
admission, control plane, metrics and flags as `spec-gateway serve`. Requests go
through `httpx.ASGITransport` (no socket, no subprocess); the app's lifespan runs
through `app.router.lifespan_context`, so start-up and teardown are the real ones.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest_asyncio
from fastapi import FastAPI

from engine.fake import FakeEngine, FakeEngineConfig
from engine.fake_backend import FakeBackend
from engine.fake_frontend import FakeFrontendConfig
from engine.settings import EngineSettings
from gateway.app import create_app
from gateway.auth import digest
from gateway.clock import MONOTONIC, Clock
from gateway.control.settings import ControllerSettings
from gateway.runtime import Runtime, runtime_factory
from gateway.settings import GatewaySettings

USER_KEY = "sk-unit-user"
ADMIN_KEY = "sk-unit-admin"
MODEL = "specgw-default"
BASE_URL = "http://gateway.test"
MESSAGES = [
    {"role": "system", "content": "You are a helpful Python assistant."},
    {"role": "user", "content": "What does the json module do?"},
]


@dataclass
class InProcessGateway:
    """A started app and an HTTP client on it (no default key: each call says its own)."""

    app: FastAPI
    http: httpx.AsyncClient

    @property
    def runtime(self) -> Runtime:
        runtime: Runtime = self.app.state.runtime
        return runtime

    @property
    def engine(self) -> FakeEngine:
        engine: FakeEngine = self.runtime.engine  # type: ignore[assignment]
        return engine

    def client(self, key: str = USER_KEY, **kwargs: Any) -> openai.AsyncOpenAI:
        """The official client on this app, through the in-process transport."""
        return openai.AsyncOpenAI(
            base_url=f"{BASE_URL}/v1", api_key=key, http_client=self.http, **kwargs
        )

    @staticmethod
    def auth(key: str | None) -> dict[str, str]:
        return {"authorization": f"Bearer {key}"} if key else {}


def gateway_settings(**overrides: Any) -> GatewaySettings:
    """Keys for a user and an admin; the rest as `spec-gateway serve` defaults them."""
    fields: dict[str, Any] = {
        "api_keys": [digest(USER_KEY)],
        "admin_keys": [digest(ADMIN_KEY)],
        "served_model_name": MODEL,
        **overrides,
    }
    return GatewaySettings(**fields)


#: No start-up calibration: each test's gateway is ready at once (one test turns it on).
QUICK_START = ControllerSettings(calibrate_batches=[])


#: An in-process exchange on the fake engine takes milliseconds; httpx's ASGITransport
#: enforces no timeout, so without this bound a request the app never answers would hold
#: its test until pytest-timeout's 1,200 s, with only the event loop's thread in the dump.
EXCHANGE_TIMEOUT_S = 120.0


def pending_tasks() -> str:
    """Every unfinished task on the running loop with the frames it is suspended in (its
    await chain: `Task.get_stack` gives a suspended coroutine's outermost frame only)."""
    lines: list[str] = []
    for task in asyncio.all_tasks():
        lines.append(repr(task))
        awaited: Any = task.get_coro()
        while awaited is not None:
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "ag_frame", None)
            if frame is not None:
                code = frame.f_code
                lines.append(f"  {code.co_filename}:{frame.f_lineno} {code.co_name}")
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "ag_await", None)
    return "\n".join(lines)


class BoundedASGITransport(httpx.ASGITransport):
    """`httpx.ASGITransport` whose exchanges time out: a hang fails its test in
    `EXCHANGE_TIMEOUT_S` with the app's pending tasks as they were at the deadline,
    kept in `hangs` (the openai client retries a failed exchange, so the test's
    teardown reports them)."""

    def __init__(self, app: FastAPI) -> None:
        super().__init__(app=app)
        self.hangs: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        task = asyncio.current_task()
        assert task is not None
        expired: list[str] = []

        def expire() -> None:  # at the deadline, before cancelling unwinds the frames
            expired.append(pending_tasks())
            task.cancel()

        deadline = asyncio.get_running_loop().call_later(EXCHANGE_TIMEOUT_S, expire)
        try:
            return await super().handle_async_request(request)
        except asyncio.CancelledError:
            if not expired or task.uncancel() > 0:
                raise
            hang = f"{request.method} {request.url} unanswered in {EXCHANGE_TIMEOUT_S} s; "
            hang += f"pending tasks:\n{expired[0]}"
            self.hangs.append(hang)
            raise httpx.ReadTimeout(hang, request=request) from None
        finally:
            deadline.cancel()


@asynccontextmanager
async def serve_in_process(
    settings: GatewaySettings | None = None,
    controller: ControllerSettings | None = None,
    engine: FakeEngineConfig | None = None,
    frontend: FakeFrontendConfig | None = None,
    clock: Clock = MONOTONIC,
) -> AsyncIterator[InProcessGateway]:
    """The app started (lifespan entered) and a client on it; stopped on exit. `clock`:
    the engine watch's (a `ManualClock` lets a test move the canary's time)."""
    factory = runtime_factory(
        EngineSettings(backend="fake"),
        controller or QUICK_START,
        backend=FakeBackend(engine, frontend or FakeFrontendConfig()),
        clock=clock,
    )
    app = create_app(settings or gateway_settings(), factory)
    transport = BoundedASGITransport(app)
    try:
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url=BASE_URL) as http,
        ):
            yield InProcessGateway(app, http)
    finally:
        if transport.hangs:  # the cause of whatever the test saw after it
            raise AssertionError("\n\n".join(transport.hangs))


@pytest_asyncio.fixture(loop_scope="session")
async def gateway() -> AsyncIterator[InProcessGateway]:
    """A fresh gateway per test (it starts in milliseconds): no state leaks between tests."""
    async with serve_in_process() as started:
        yield started
