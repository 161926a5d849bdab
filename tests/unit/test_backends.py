"""The backend registry: names, the setting that picks one, and the error for a wrong one."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from engine.fake_frontend import FakeFrontend
from engine.settings import EngineSettings
from gateway.backends import BACKENDS, fake_runtime_factory, runtime_factory
from gateway.cli import app
from gateway.config import resolve
from gateway.runtime import real_runtime_factory
from tests.unit.conftest import QUICK_START, gateway_settings

pytestmark = pytest.mark.asyncio(loop_scope="session")


def test_the_registry_names_both_backends() -> None:
    assert {"vllm": real_runtime_factory, "fake": fake_runtime_factory} == BACKENDS


def test_the_setting_names_exactly_the_registered_backends() -> None:
    """`engine.backend` is validated as settings are read: its names are the registry's."""
    assert set(get_args(EngineSettings.model_fields["backend"].annotation)) == set(BACKENDS)
    with pytest.raises(ValidationError, match="'vllm' or 'fake'"):
        EngineSettings(backend="sglang")


def test_an_unknown_backend_names_the_known_ones() -> None:
    fields: dict[str, Any] = {"backend": "sglang"}
    unchecked = EngineSettings.model_construct(**fields)  # past the settings' check
    with pytest.raises(ValueError, match="unknown engine backend 'sglang'") as caught:
        runtime_factory(unchecked)
    assert "fake, vllm" in str(caught.value)


def test_the_backend_comes_from_env_yaml_or_flag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert EngineSettings().backend == "vllm"
    config = tmp_path / "gateway.yaml"
    config.write_text("engine:\n  backend: fake\n")
    monkeypatch.delenv("SPECGW_ENGINE_BACKEND", raising=False)
    assert resolve(config_file=config).engine.backend == "fake"
    monkeypatch.setenv("SPECGW_ENGINE_BACKEND", "vllm")
    assert resolve(config_file=config).engine.backend == "vllm"
    assert resolve(["--engine.backend", "fake"], config).engine.backend == "fake"


def test_serve_refuses_an_unknown_backend_before_starting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPECGW_ENGINE_BACKEND", raising=False)
    result = CliRunner().invoke(app, ["serve", "--backend", "nope"], env={"COLUMNS": "200"})
    assert result.exit_code == 2, result.output
    assert "engine.backend: Input should be 'vllm' or 'fake' (got 'nope')" in result.output


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
