"""`spec-gateway serve`: help for every option, settings precedence, the loopback rule.

Flags, YAML config, environment overrides (gateway.config), `--help` that explains each
setting, and no keys = loopback only. No engine is started.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.app import create_app
from gateway.cli import app
from gateway.config import resolve, setting_docs
from gateway.settings import GatewaySettings


def test_serve_help_explains_every_setting() -> None:
    """Each setting's YAML key, flag, environment names and description are in --help."""
    result = CliRunner().invoke(app, ["serve", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert "flags > environment > YAML file > defaults" in text
    docs = setting_docs()
    assert {d.path[0] for d in docs} >= {"engine", "control", "flags", "state", "tenants"}
    for doc in docs:
        assert doc.description, f"{doc.key} has no help text"
        entry = f"{doc.key}: {doc.flag}, {', '.join(doc.env)} (default"
        assert entry in text, entry


def test_flags_beat_environment_beat_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "gateway.yaml"
    config.write_text(
        "port: 9001\nmax_running: 7\nmax_queued: 9\nengine:\n  max_depth: 2\n  kv_cache_gib: 3\n"
        "control:\n  hysteresis: 0.2\n  min_dwell: 6\n"
    )
    for name in [n for n in os.environ if n.startswith("SPECGW_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SPECGW_MAX_RUNNING", "11")
    monkeypatch.setenv("SPECGW_ENGINE_KV_CACHE_GIB", "5")
    monkeypatch.setenv("SPECGW_CONTROL_MIN_DWELL", "8")
    settings = resolve(["--port", "9002", "--control.min-dwell", "9"], config)
    assert (settings.port, settings.max_running, settings.max_queued) == (9002, 11, 9)
    assert (settings.engine.max_depth, settings.engine.kv_cache_gib) == (2, 5)
    assert (settings.control.hysteresis, settings.control.min_dwell) == (0.2, 9)
    assert resolve(["--engine.max-depth", "4"], config).engine.max_depth == 4
    assert resolve([], config).control.min_dwell == 8


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
