"""`spec-gateway serve`: help for every option, settings precedence, the loopback rule.

Flags, YAML config, environment overrides (gateway.config), `--help` with the common
settings of each section and `--help-all` that explains every one, and no keys = loopback
only. No engine is started.
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
from gateway.config import SettingDoc, resolve, setting_docs
from gateway.config.help import COMMON, SECTIONS, by_section, section_of
from gateway.settings import GatewaySettings


def _help(*args: str) -> str:
    """The help text alone (stdout: a warning a test beside it left on stderr, or a log line,
    is not help), from its `Usage:` line, one space between words."""
    result = CliRunner().invoke(app, ["serve", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.replace("│", " ").split())
    return text[text.index("Usage:") :]


def _entry(doc: SettingDoc) -> str:
    return f"{doc.key}: {doc.flag}, {', '.join(doc.env)} (default"


def test_serve_help_all_explains_every_setting_by_section() -> None:
    """Each setting's YAML key, flag, environment names and description are in
    --help-all, under its section's heading, sections in order."""
    text = _help("--help-all")
    assert "flags > environment > YAML file > defaults" in text
    assert "--check-config" in text, "the options come first, as in --help"
    docs = setting_docs()
    assert {d.path[0] for d in docs} >= {"engine", "control", "flags", "state", "tenants"}
    headings = [text.index(f"{section.upper()} (") for section in SECTIONS]
    assert headings == sorted(headings)
    for doc in docs:
        assert doc.description, f"{doc.key} has no help text"
        at = text.index(_entry(doc))
        section = list(SECTIONS).index(section_of(doc))
        assert headings[section] < at, doc.key
        assert section + 1 == len(headings) or at < headings[section + 1], doc.key


def test_serve_help_shows_the_common_settings_of_each_section() -> None:
    """--help: every section's heading with its count, the settings `COMMON` names and no
    others; at most a third of --help-all."""
    text = _help("--help")
    docs = {doc.key: doc for doc in setting_docs()}
    common = {key for keys in COMMON.values() for key in keys}
    assert common <= set(docs), f"not settings: {sorted(common - set(docs))}"
    for section, members in by_section(docs.values()).items():
        assert f"{section.upper()} (" in text
        assert f"; {len(members)} settings" in text, section
        assert all(section_of(docs[key]) == section for key in COMMON[section]), section
    for key, doc in docs.items():
        assert (_entry(doc) in text) == (key in common), key
    assert f"({len(docs)} with --help-all)" in text
    help_all = _help("--help-all")
    assert len(text.split()) * 3 < len(help_all.split()), (text[:300], help_all[:300])


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
