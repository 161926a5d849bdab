"""`spec-gateway plan` (`engine.vllm.plan`): what the engine would run, printed before a
GPU is rented. A Llama-3.1-8B-shaped target with an EAGLE-3 head (their published
configs and Llama 3.1's chat template, no weights): graphs, every width 1 + k captured,
V2, async scheduling, `llama3_json`, the model id as the served name, a KV budget from
the configs; an operator's schedule that leaves a depth without a FULL graph is
refused in one line. Drives the real CLI and the installed vLLM's config (no engine)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from engine.settings import EngineSettings
from engine.vllm.plan import (
    PlanError,
    check_capture,
    cuda_plan,
    kv_bytes_per_token,
    parameter_count,
)
from gateway.cli import app

MODELS = Path(__file__).parents[1] / "cuda" / "models"


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The 8B target and its EAGLE-3 head as directories: configs and chat template."""
    root = tmp_path_factory.mktemp("llama31")
    target, drafter = root / "target", root / "drafter"
    shutil.copytree(MODELS / "llama-3.1-8b-instruct", target)
    shutil.copytree(MODELS / "eagle3-llama3.1-instruct-8b", drafter)
    template = (MODELS / "llama3.1_chat_template.jinja").read_text(encoding="utf-8")
    (target / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": template}), encoding="utf-8"
    )
    return target, drafter


def _config(model: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((model / "config.json").read_text(encoding="utf-8"))
    return loaded


def test_the_8b_shapes_are_counted_as_published(llama: tuple[Path, Path]) -> None:
    target, _ = llama
    assert round(parameter_count(_config(target)) / 1e9, 2) == 8.03
    assert kv_bytes_per_token(_config(target), 2) == 128 * 1024  # 2 x 32 x 8 x 128 x 2 B


def test_the_plan_for_an_8b_model_on_cuda(llama: tuple[Path, Path]) -> None:
    target, drafter = llama
    result = CliRunner().invoke(app, ["plan", "--model", str(target), "--drafter", str(drafter)])
    assert result.exit_code == 0, result.output
    out = result.output
    cuda = out[out.index("[CUDA") :]
    assert f"served model names: {target}" in out
    assert "tool-call parser: llama3_json" in out
    assert "torch.compile + CUDA graphs (cudagraph_mode FULL_AND_PIECEWISE)" in cuda
    assert "model runner V2, async scheduling on" in cuda
    assert "batch-depth rule: uniform; step depths: 0, 1, 2, 3, 4" in cuda
    for k in range(5):
        assert f"k={k} (width {k + 1}) to batch" in cuda
    assert "max_num_seqs 256, max_model_len 131072, gateway max_running 256" in cuda
    assert "KV cache (estimate)" in cuda


def test_an_operator_schedule_without_every_width_is_refused(llama: tuple[Path, Path]) -> None:
    target, drafter = llama
    settings = EngineSettings(
        model=target, drafter=drafter, spec_tokens_per_batch_size=[(1, 8, 4), (9, 256, 2)]
    )
    plan = cuda_plan(settings, _config(target), _config(drafter), 80.0)
    assert set(plan.full_batch) == {2, 4}
    with pytest.raises(PlanError, match=r"depths \[1, 3\] no FULL decode graph"):
        check_capture(settings, plan)
    result = CliRunner().invoke(
        app,
        [
            "plan",
            "--model",
            str(target),
            "--drafter",
            str(drafter),
            "--engine.spec-tokens-per-batch-size",
            "[[1, 8, 4], [9, 256, 2]]",
        ],
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("spec-gateway: ")]
    assert len(lines) == 1
    assert "no FULL decode graph" in lines[0]


def test_without_the_gateways_schedule_v2_captures_width_1_plus_k_alone(
    llama: tuple[Path, Path],
) -> None:
    """What a default deployment ran before: eager on CUDA, no FULL graph at all; with
    graphs but V2 left to its own schedule-less capture, width 1 + K alone."""
    target, drafter = llama
    eager = EngineSettings(model=target, drafter=drafter, enforce_eager=True)
    assert cuda_plan(eager, _config(target), _config(drafter), 80.0).full_batch == {}
    full = EngineSettings(model=target, drafter=drafter, spec_tokens_per_batch_size=[(1, 256, 4)])
    assert set(cuda_plan(full, _config(target), _config(drafter), 80.0).full_batch) == {4}
