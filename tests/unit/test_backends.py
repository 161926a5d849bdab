"""The backend registry: names, the setting that picks one, and the error for a wrong one."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.fake_frontend import FakeFrontend
from engine.settings import EngineSettings
from gateway.backends import BACKENDS, fake_runtime_factory, runtime_factory
from gateway.cli import app
from gateway.runtime import real_runtime_factory
from tests.unit.conftest import QUICK_START, gateway_settings

pytestmark = pytest.mark.asyncio(loop_scope="session")


def test_the_registry_names_both_backends() -> None:
    assert {"vllm": real_runtime_factory, "fake": fake_runtime_factory} == BACKENDS


def test_an_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="unknown engine backend 'sglang'") as caught:
        runtime_factory(EngineSettings(backend="sglang"))
    assert "fake, vllm" in str(caught.value)


def test_the_backend_comes_from_env_yaml_or_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert EngineSettings().backend == "vllm"
    config = tmp_path / "gateway.yaml"
    config.write_text("engine:\n  backend: fake\n")
    monkeypatch.delenv("SPECGW_ENGINE_BACKEND", raising=False)
    assert EngineSettings.load(config).backend == "fake"
    monkeypatch.setenv("SPECGW_ENGINE_BACKEND", "vllm")
    assert EngineSettings.load(config).backend == "vllm"
    assert EngineSettings.load(config, backend="fake").backend == "fake"


def test_serve_refuses_an_unknown_backend_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECGW_ENGINE_BACKEND", raising=False)
    result = CliRunner().invoke(app, ["serve", "--backend", "nope"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "unknown engine backend 'nope'" in result.output
    assert "fake, vllm" in result.output


async def test_the_fake_backend_builds_the_production_runtime() -> None:
    """The same `Runtime` the vLLM backend builds, on the fake engine and port."""
    engine = EngineSettings(backend="fake", max_depth=2, max_model_len=256)
    factory = runtime_factory(engine, QUICK_START)
    async with factory(gateway_settings()) as runtime:
        assert isinstance(runtime.frontend, FakeFrontend)
        assert runtime.engine.max_depth == 2
        assert (await runtime.frontend.models()).data[0].max_model_len == 256
        assert runtime.ready
        assert runtime.flag_view is not None
