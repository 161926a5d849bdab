"""The backend registry: names, the setting that picks one, and the error for a wrong one."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
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


def test_the_vllm_backend_plugs_in_by_its_module_and_attribute() -> None:
    from engine.vllm.backend import BACKEND, VLLMBackend
    from engine.vllm.compat import installed_vllm_version
    from gateway.plugins import PLUGINS, load_backend

    assert PLUGINS["vllm"] == "engine.vllm.backend:BACKEND"
    backend = load_backend("vllm")
    assert backend is BACKEND
    assert isinstance(backend, VLLMBackend)
    assert backend.library_version() == installed_vllm_version()


def test_the_gateway_imports_the_vllm_backend_only_when_it_is_chosen() -> None:
    """The composition root names the backend as text: importing the gateway's modules
    (the app, the registry, the CLI) imports nothing of `engine.vllm`."""
    code = (
        "import sys, gateway.app, gateway.backends, gateway.cli, gateway.runtime\n"
        "print(sorted(m for m in sys.modules if m.startswith('engine.vllm')))"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout


def test_the_agnostic_engine_contract_names_every_module_outside_engine_vllm() -> None:
    """pyproject's contract lists engine's vLLM-free modules one by one: a new module
    in engine/ (outside engine/vllm/ and the wire-model re-export) must be added there."""
    root = Path(__file__).resolve().parents[2]
    config = tomllib.loads((root / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    agnostic = next(c for c in contracts if c["name"].startswith("Among engine's modules"))
    modules = {f"engine.{p.stem}" for p in (root / "engine").glob("*.py") if p.stem != "__init__"}
    assert set(agnostic["source_modules"]) == modules - {"engine.protocol"}
