"""Admin routes and the CLI over real HTTP (uvicorn on loopback) and a real redis-server."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from typer.testing import CliRunner

from gateway.admin_client import (
    AdminClientError,
    classes_command,
    connect,
    flags_app,
    format_table,
    get_audit,
    get_classes,
    get_flags,
    set_flag,
    unset_flag,
)
from gateway.api.admin_routes import router as classes_router
from gateway.api.deps import require_admin
from gateway.auth import KeyRing, digest
from gateway.errors import GatewayError
from gateway.flags import FlagAdmin, FlagSettings, FlagView
from gateway.flags.admin_routes import build_flags_router
from tests.clock import until_sync
from tests.redis_fixtures import RedisServer, free_port

ADMIN_KEY = "admin-secret"
USER_KEY = "user-secret"


class ClassTable:
    """Stands in for the runtime's class report (the controller is wired by the lead)."""

    ready = True

    def class_report(self) -> list[dict[str, Any]]:
        return [
            {"class": "c1", "label": "code", "samples": 120, "acceptance_length": 2.2411, "k": 4},
            {"class": "c2", "label": "chat", "samples": 7, "acceptance_length": None, "k": 0},
        ]


def build_app(redis_url: str) -> FastAPI:
    settings = FlagSettings(
        namespace="t", redis_url=redis_url, override_poll_interval_s=0.5, op_timeout_s=0.3
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.flag_admin = FlagAdmin.connect(settings)
        app.state.flag_view = FlagView(settings)
        await app.state.flag_view.start()
        yield
        await app.state.flag_view.close()
        await app.state.flag_admin.close()

    app = FastAPI(lifespan=lifespan)
    app.state.keyring = KeyRing([digest(USER_KEY)], [digest(ADMIN_KEY)])
    app.state.runtime = ClassTable()

    @app.exception_handler(GatewayError)
    async def on_error(request: Request, exc: GatewayError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.response_headers())

    app.include_router(
        build_flags_router(lambda: app.state.flag_admin, require_admin, lambda: app.state.flag_view)
    )
    app.include_router(classes_router)
    return app


@pytest.fixture
def gateway_url(redis_server: RedisServer) -> Iterator[str]:
    port = free_port()
    config = uvicorn.Config(
        build_app(redis_server.url), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    until_sync(lambda: server.started, 10.0, "uvicorn started")
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(10)


def test_set_get_unset_and_audit(gateway_url: str) -> None:
    with connect(gateway_url, ADMIN_KEY) as client:
        entry = set_flag(client, "speculation-enabled", "false")
        assert (entry["old"], entry["new"], entry["target"]) == (None, False, "all")
        took = until_sync(lambda: get_flags(client)["effective"]["enabled"] is False, 2.0)
        set_flag(client, "pin-k", "0", class_id="c1")
        set_flag(client, "pin-k", 2, label="code")
        assert get_flags(client, class_id="c1", label="code")["effective"]["pin_k"] == 0
        assert get_flags(client, class_id="c9", label="code")["effective"]["pin_k"] == 2
        listed = get_flags(client, flag="pin-k")["overrides"]
        assert [(o["target"], o["value"]) for o in listed] == [("class=c1", 0), ("label=code", 2)]
        entry = unset_flag(client, "speculation-enabled")
        assert (entry["old"], entry["new"], entry["action"]) == (False, None, "unset")
        # Read-your-writes on the replica that took the write: no wait.
        assert get_flags(client)["effective"]["enabled"] is True
        audit = get_audit(client, 10)
    assert took < 2.0
    assert [(a["flag"], a["action"]) for a in audit] == [
        ("speculation-enabled", "unset"),
        ("pin-k", "set"),
        ("pin-k", "set"),
        ("speculation-enabled", "set"),
    ]
    fingerprint = digest(ADMIN_KEY)[:12]
    assert all(fingerprint in a["who"] and "@" in a["who"] for a in audit)
    assert ADMIN_KEY not in str(audit)
    assert audit[1]["target"] == "label=code"
    assert audit[0]["at"] >= audit[-1]["at"] > 0


def test_rejects_user_keys_bad_flags_and_bad_values(gateway_url: str) -> None:
    with connect(gateway_url, USER_KEY) as client, pytest.raises(AdminClientError) as denied:
        get_flags(client)
    assert denied.value.status == 403
    with connect(gateway_url, "wrong") as client, pytest.raises(AdminClientError) as denied:
        get_flags(client)
    assert denied.value.status == 401
    with connect(gateway_url, ADMIN_KEY) as client:
        for flag, value in [("no-such-flag", "1"), ("k-max", "lots"), ("controller-mode", "x")]:
            with pytest.raises(AdminClientError) as bad:
                set_flag(client, flag, value)
            assert bad.value.status == 400
        with pytest.raises(AdminClientError) as both:
            set_flag(client, "pin-k", 1, class_id="c", label="l")
        assert both.value.status == 400
        assert get_audit(client) == []  # nothing invalid was recorded


def test_redis_down_is_503_then_recovers(gateway_url: str, redis_server: RedisServer) -> None:
    with connect(gateway_url, ADMIN_KEY) as client:
        set_flag(client, "k-min", 1)
        redis_server.stop()
        with pytest.raises(AdminClientError) as down:
            set_flag(client, "k-min", 2)
        assert down.value.status == 503
        redis_server.start()
        # The admin's pooled connection died with the server; the first call after works.
        assert set_flag(client, "k-min", 3)["old"] == 1
        until_sync(lambda: get_flags(client)["effective"]["k_min"] == 3, 2.0)


def test_cli_commands(gateway_url: str) -> None:
    runner = CliRunner()
    env = {"SPECGW_URL": gateway_url, "SPECGW_ADMIN_KEY": ADMIN_KEY}
    result = runner.invoke(flags_app, ["set", "controller-mode", "shadow"], env=env)
    assert result.exit_code == 0, result.output
    assert "controller-mode [all]: None -> shadow" in result.output
    result = runner.invoke(flags_app, ["set", "pin-k", "none", "--class", "c1"], env=env)
    assert result.exit_code == 0, result.output
    result = runner.invoke(flags_app, ["get"], env=env)
    assert result.exit_code == 0, result.output
    assert "controller-mode  all" in result.output
    result = runner.invoke(flags_app, ["audit"], env=env)
    assert "pin-k" in result.output
    result = runner.invoke(flags_app, ["set", "k-max", "nope"], env=env)
    assert result.exit_code == 1
    assert "HTTP 400" in result.output


def test_classes_table(gateway_url: str) -> None:
    with connect(gateway_url, ADMIN_KEY) as client:
        rows = get_classes(client)
    table = format_table(rows).splitlines()
    assert table[0].split() == ["class", "label", "samples", "acceptance_length", "k"]
    assert table[1].split() == ["c1", "code", "120", "2.241", "4"]
    assert table[2].split() == ["c2", "chat", "7", "-", "0"]
    # The typer command the lead mounts as `spec-gateway classes`.
    app = __import__("typer").Typer()
    app.command()(classes_command)
    result = CliRunner().invoke(
        app, [], env={"SPECGW_URL": gateway_url, "SPECGW_ADMIN_KEY": ADMIN_KEY}
    )
    assert result.exit_code == 0, result.output
    assert "acceptance_length" in result.output
