"""`spec-gateway serve` refuses at start, in one line and exit status 2, before any
engine is built: a drafter that does not fit its target, a missing model, an untested
vLLM. Drives the real CLI in-process (no engine, no download)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli import app
from tools.model.testing_models import TinyModels


def _serve(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["serve", *args], env={"SPECGW_LOG_LEVEL": "warning"})
    return result.exit_code, result.output


def _one_error_line(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert lines[0].startswith("spec-gateway: ")
    return lines[0]


def test_a_drafter_that_does_not_fit_its_target(tmp_path: Path, tiny: TinyModels) -> None:
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    config = json.loads((tiny.drafter / "config.json").read_text(encoding="utf-8"))
    config["target_hidden_size"] = config["hidden_size"] * 2
    (drafter / "config.json").write_text(json.dumps(config), encoding="utf-8")
    code, output = _serve("--model", str(tiny.target), "--drafter", str(drafter))
    assert code == 2
    line = _one_error_line(output)
    assert f"drafter {drafter} does not fit target {tiny.target}: hidden size" in line


def test_a_missing_model(tmp_path: Path) -> None:
    code, output = _serve("--model", str(tmp_path / "absent"))
    assert code == 2
    assert "target not found" in _one_error_line(output)


def test_a_wrong_vllm_version(monkeypatch: pytest.MonkeyPatch, tiny: TinyModels) -> None:
    monkeypatch.setattr("engine.vllm.compat.installed_vllm_version", lambda: "0.31.0")
    code, output = _serve("--model", str(tiny.target), "--drafter", str(tiny.drafter))
    assert code == 2
    assert "vLLM 0.31.0 is not a tested version" in _one_error_line(output)


def test_a_batch_size_schedule_vllm_would_refuse_in_its_engine_core(tiny: TinyModels) -> None:
    result = CliRunner().invoke(
        app,
        ["serve", "--model", str(tiny.target), "--drafter", str(tiny.drafter)],
        env={"SPECGW_ENGINE_SPEC_TOKENS_PER_BATCH_SIZE": "[[2, 8, 2]]"},
    )
    assert result.exit_code == 2
    assert "spec_tokens_per_batch_size: " in _one_error_line(result.output)


def test_a_driver_older_than_the_cuda_build_needs_is_refused() -> None:
    """CUDA 13.0's libraries need driver 580 (the CUDA build's torch is cu130); an older
    one fails at the first CUDA call, after the weights downloaded."""
    from engine.vllm.preflight import EngineSettingsError, check_driver

    with pytest.raises(EngineSettingsError, match=r"^NVIDIA driver 570.86.10 is older than 580"):
        check_driver("13.0", "570.86.10")
    check_driver("13.0", "580.65.06")
    check_driver("12.8", "570.86.10")  # a CUDA 12 build runs on it
    check_driver("13.0", None)  # no GPU visible: nothing to check
    check_driver(None, "535.0")  # a CPU build of torch
