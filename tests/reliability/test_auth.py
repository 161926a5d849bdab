"""Every /v1 and /admin route refuses missing, wrong and wrong-scope keys.

The routes are enumerated from the app itself (`app.routes`, every method of
every route, documented or not) and cross-checked with the live
`/openapi.json`, so a route added later is tested without editing this file.
The requests go to a real gateway process.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute

from gateway.app import create_app
from gateway.auth import digest
from gateway.settings import GatewaySettings
from tests.gateway.conftest import ADMIN_KEY, USER_KEY, GatewayProcess

pytestmark = pytest.mark.engine

PROTECTED = ("/v1", "/admin")


@asynccontextmanager
async def _never_started(settings: GatewaySettings) -> AsyncIterator[None]:
    raise AssertionError("route enumeration must not start a runtime")
    yield  # pragma: no cover


def protected_routes() -> list[tuple[str, str]]:
    """(method, path) of every /v1 and /admin route the app serves."""
    settings = GatewaySettings(api_keys=[digest(USER_KEY)], admin_keys=[digest(ADMIN_KEY)])
    app = create_app(settings, _never_started)
    out: set[tuple[str, str]] = set()
    for route in app.routes:
        path = getattr(route, "path", "")
        if not path.startswith(PROTECTED):
            continue
        assert isinstance(route, APIRoute), f"{path} is not an APIRoute; auth unknown"
        out.update((method, path) for method in route.methods if method != "HEAD")
    return sorted(out)


ROUTES = protected_routes()


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "speculation-enabled", path)


def _call(gw: GatewayProcess, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
    body: dict[str, Any] | None = {"value": True} if method in ("PUT", "POST") else None
    if path.startswith("/v1") and method == "POST":
        body = {"model": "specgw-default", "messages": [{"role": "user", "content": "hi"}]}
        body |= {"prompt": "hi", "max_tokens": 1}
    return httpx.request(
        method, gw.base_url + _concrete(path), json=body, headers=headers, timeout=30
    )


def _assert_refused(response: httpx.Response, status: int) -> None:
    assert response.status_code == status, (response.status_code, response.text)
    error = response.json()["error"]
    assert error["type"] in ("authentication_error", "permission_error")
    assert error["message"]
    assert response.headers.get("x-request-id")


def test_route_list_is_complete_and_documented(shared_gateway: GatewayProcess) -> None:
    documented = httpx.get(f"{shared_gateway.base_url}/openapi.json", timeout=30).json()["paths"]
    listed = {
        (method.upper(), path)
        for path, ops in documented.items()
        if path.startswith(PROTECTED)
        for method in ops
    }
    assert listed <= set(ROUTES), listed - set(ROUTES)
    assert {("POST", "/v1/chat/completions"), ("GET", "/admin/classes")} <= set(ROUTES)
    assert len(ROUTES) >= 8, ROUTES


BAD_HEADERS = {
    "missing": {},
    "empty_bearer": {"authorization": "Bearer"},
    "basic_scheme": {"authorization": f"Basic {USER_KEY}"},
    "wrong_key": {"authorization": "Bearer sk-not-a-key"},
    "key_prefix": {"authorization": f"Bearer {USER_KEY[:-1]}"},
    "key_digest": {"authorization": f"Bearer {digest(USER_KEY)}"},
}


@pytest.mark.parametrize(("method", "path"), ROUTES)
@pytest.mark.parametrize("variant", sorted(BAD_HEADERS))
def test_missing_or_wrong_key_is_401(
    shared_gateway: GatewayProcess, method: str, path: str, variant: str
) -> None:
    response = _call(shared_gateway, method, path, BAD_HEADERS[variant])
    _assert_refused(response, 401)
    assert response.headers.get("www-authenticate") == "Bearer"


@pytest.mark.parametrize(("method", "path"), ROUTES)
def test_wrong_scope_is_403_and_right_scope_passes(
    shared_gateway: GatewayProcess, method: str, path: str
) -> None:
    admin = path.startswith("/admin")
    wrong, right = (USER_KEY, ADMIN_KEY) if admin else (ADMIN_KEY, USER_KEY)
    _assert_refused(_call(shared_gateway, method, path, {"authorization": f"Bearer {wrong}"}), 403)
    if method in ("PUT", "DELETE"):
        return  # a right-scope write would change the shared gateway's flags
    passed = _call(shared_gateway, method, path, {"authorization": f"Bearer {right}"})
    assert passed.status_code not in (401, 403), (passed.status_code, passed.text)
