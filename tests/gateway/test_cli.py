"""`spec-gateway serve`: help for every option, settings precedence, the loopback rule.

Flags, YAML config, environment overrides, `--help` that explains each option, and
no keys = loopback only. No engine is started.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.settings import EngineSettings
from gateway.app import create_app
from gateway.cli import app
from gateway.settings import GatewaySettings


def test_serve_help_explains_every_gateway_and_engine_setting() -> None:
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for model in (GatewaySettings, EngineSettings):
        prefix = str(model.model_config.get("env_prefix", ""))
        for name, info in model.model_fields.items():
            assert f"{prefix}{name}".upper() in result.output, name
            assert info.description, f"{model.__name__}.{name} has no help text"


def test_flags_beat_environment_beat_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "port: 9001\nmax_running: 7\nmax_queued: 9\nengine:\n  max_depth: 2\n  kv_cache_gib: 3\n"
    )
    for name in [n for n in os.environ if n.startswith("SPECGW_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SPECGW_MAX_RUNNING", "11")
    monkeypatch.setenv("SPECGW_ENGINE_KV_CACHE_GIB", "5")
    settings = GatewaySettings.load(config, port=9002)
    assert (settings.port, settings.max_running, settings.max_queued) == (9002, 11, 9)
    engine = EngineSettings.load(config, max_depth=None)
    assert (engine.max_depth, engine.kv_cache_gib) == (2, 5)
    assert EngineSettings.load(config, max_depth=4).max_depth == 4


@asynccontextmanager
async def _never_started(_: GatewaySettings) -> AsyncIterator[None]:
    raise AssertionError("the exposure check runs before any runtime starts")
    yield  # pragma: no cover


@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::"])
def test_no_keys_refuses_any_address_but_loopback(host: str) -> None:
    with pytest.raises(ValueError, match="without API keys"):
        create_app(GatewaySettings(host=host), _never_started)
    create_app(GatewaySettings(host=host, api_keys=["ab" * 32]), _never_started)
    create_app(GatewaySettings(host="127.0.0.1"), _never_started)
