"""schemathesis on a gateway without a vLLM engine, in seconds, in every `make test`.

The engine-backed run (`test_schemathesis.py`) drives `/v1` to real answers;
this one keeps the error side of the OpenAPI document honest: each status a
route really returns is documented, with the body it really has (401/403 for a
user key on `/admin`, 400 for a bad body or query, 503 while the engine is not
ready or without Redis, 405 with a complete `allow` header). The runtime is the
scripted `FakeEngine` behind the few attributes these routes read.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from engine.fake import FakeEngine
from gateway.app import create_app
from gateway.auth import digest
from gateway.settings import GatewaySettings

USER_KEY = "sk-ops-user"


@dataclass
class _OpsRuntime:
    """What `/health`, `/ready`, `/metrics` and `/admin/*` read from the runtime."""

    engine: FakeEngine = field(default_factory=FakeEngine)
    #: Not ready: `/v1` completions answer 400 or 503 without reaching an engine.
    ready: bool = False
    flag_admin: None = None
    flag_view: None = None

    def render_metrics(self) -> tuple[bytes, str]:
        return b"", "text/plain; version=0.0.4"

    def class_report(self) -> list[dict[str, Any]]:
        return []

    async def readiness(self) -> dict[str, Any]:
        health = await self.engine.health()
        return {"ready": health.ready, "detail": {"engine": health.detail or "ready"}}

    async def liveness(self) -> tuple[str, str | None]:
        health = await self.engine.health()
        return ("ok", None) if health.alive else ("dead", health.detail)


@asynccontextmanager
async def _runtime(_: GatewaySettings) -> AsyncIterator[_OpsRuntime]:
    yield _OpsRuntime()


_app = create_app(GatewaySettings(api_keys=[digest(USER_KEY)]), _runtime)
# `/v1/responses` takes OpenAI's request schema (unions of ~30 input item and ~15 tool
# types): schemathesis spends about 10 s per generated case on it, so its error side is
# checked by the explicit tests below instead.
schema = schemathesis.openapi.from_asgi("/openapi.json", _app).exclude(
    path_regex="^/v1/(models|responses)"
)


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_errors_conform_to_the_schema(case: Any) -> None:
    # A not-ready engine is a documented 503 here, not the server error it is elsewhere.
    excluded = [not_a_server_error] if case.path.startswith("/v1/") else []
    case.call_and_validate(
        headers={"authorization": f"Bearer {USER_KEY}"}, excluded_checks=excluded
    )


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/responses", {"input": "hi"}),
    ],
)
async def test_v1_is_503_with_retry_after_until_the_engine_is_ready(
    path: str, body: dict[str, Any]
) -> None:
    """Before the runtime is up (no lifespan yet), 503 in OpenAI's shape."""
    transport = httpx.ASGITransport(app=_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        response = await client.post(
            path,
            json={"model": "specgw-default", **body},
            headers={"authorization": f"Bearer {USER_KEY}"},
        )
    assert response.status_code == 503
    assert response.headers["retry-after"]
    assert response.headers["x-request-id"]
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("service_unavailable", "not_ready")


async def test_responses_errors_are_documented_and_openai_shaped() -> None:
    """What the schemathesis run checks elsewhere, for `/v1/responses`: the errors it
    returns (401 here, 503 above, the 400s in tests/unit/test_responses.py) are in the
    OpenAPI document, with OpenAI's error body; its 200 is JSON or an SSE stream."""
    transport = httpx.ASGITransport(app=_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        response = await client.post("/v1/responses", json={"input": "hi"})
        document = (await client.get("/openapi.json")).json()
    assert response.status_code == 401
    assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    documented = document["paths"]["/v1/responses"]["post"]["responses"]
    assert {"400", "401", "429", "503"} <= set(documented)
    assert "text/event-stream" in documented["200"]["content"]
