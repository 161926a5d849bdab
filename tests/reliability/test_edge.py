"""The request edge without an engine: CORS is off unless configured, and a client's
`x-request-id` is propagated when plain and replaced when not."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest

from gateway.app import create_app
from gateway.settings import GatewaySettings

ORIGIN = "https://app.example.com"
PREFLIGHT = {"origin": ORIGIN, "access-control-request-method": "POST"}


@asynccontextmanager
async def _never_started(settings: GatewaySettings) -> AsyncIterator[None]:
    raise AssertionError("the edge must answer without a runtime")
    yield  # pragma: no cover


async def _call(settings: GatewaySettings, method: str, headers: dict[str, str]) -> httpx.Response:
    transport = httpx.ASGITransport(app=create_app(settings, _never_started))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        return await client.request(method, "/v1/chat/completions", headers=headers)


async def test_cors_is_off_by_default() -> None:
    response = await _call(GatewaySettings(), "OPTIONS", PREFLIGHT)
    assert "access-control-allow-origin" not in response.headers
    assert response.status_code == 405


async def test_cors_allows_only_the_configured_origins() -> None:
    settings = GatewaySettings(cors_origins=[ORIGIN])
    allowed = await _call(settings, "OPTIONS", PREFLIGHT)
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    other = await _call(settings, "OPTIONS", PREFLIGHT | {"origin": "https://evil.example"})
    assert "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize(
    ("sent", "kept"),
    [("req-42.a:b_c", True), ("x" * 129, False), ("has space", False), ("", False)],
)
async def test_client_request_id_is_propagated_only_when_plain(sent: str, kept: bool) -> None:
    response = await _call(GatewaySettings(), "GET", {"x-request-id": sent})
    rid = response.headers["x-request-id"]
    assert (rid == sent) is kept
    assert rid
