"""The backend registry (`engine.backend.PLUGINS`): names, the setting that picks one, the
error for a wrong one, and each backend loaded by its plugin like any other."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from engine.backend import PLUGINS, EngineBackend, load_backend
from engine.fake_backend import FakeBackend
from engine.fake_frontend import FakeFrontend
from engine.settings import EngineSettings
from gateway.cli import app
from gateway.config import resolve
from gateway.runtime import runtime_factory
from tests.unit.conftest import QUICK_START, gateway_settings

pytestmark = pytest.mark.asyncio(loop_scope="session")


def test_the_registry_names_both_backends_each_an_engine_backend() -> None:
    assert PLUGINS == {
        "vllm": "engine.vllm.backend:BACKEND",
        "fake": "engine.fake_backend:BACKEND",
    }
    fake = load_backend("fake")
    assert isinstance(fake, FakeBackend)
    assert fake.library_version() is None
    for name in PLUGINS:
        backend: EngineBackend = load_backend(name)
        for member in ("library_version", "preflight", "startup_plan", "start_engine"):
            assert callable(getattr(backend, member)), (name, member)


def test_the_setting_names_exactly_the_registered_backends() -> None:
    """`engine.backend` is validated as settings are read, against the registry."""
    for name in PLUGINS:
        assert EngineSettings(backend=name).backend == name
    with pytest.raises(ValidationError, match="backend must be one of fake, vllm"):
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
    assert "engine.backend: backend must be one of fake, vllm (got 'nope')" in result.output


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

    assert PLUGINS["vllm"] == "engine.vllm.backend:BACKEND"
    backend = load_backend("vllm")
    assert backend is BACKEND
    assert isinstance(backend, VLLMBackend)
    assert backend.library_version() == installed_vllm_version()


def test_the_gateway_imports_the_vllm_backend_only_when_it_is_chosen() -> None:
    """The registry names each backend as text: importing the gateway's modules (the app,
    the runtime, the CLI) and the registry imports nothing of `engine.vllm`."""
    code = (
        "import sys, engine.backend, engine.settings, gateway.app, gateway.cli, gateway.runtime\n"
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
