"""The verify budget on CUDA: `engine.verify_budget` turns on vLLM 0.33's own adaptive
verification in the speculative config `engine_args` builds, validated by 0.33's config
classes (no GPU: its kernels are not run here)."""

from __future__ import annotations

import logging

import pytest

from engine.settings import EngineSettings
from engine.vllm.confidence_budget import VERIFY_BUDGET_KEY
from engine.vllm.engine_args import engine_args
from tools.model.testing_models import TinyModels


@pytest.mark.parametrize("mode", ["on", "vllm-av"])
def test_the_budget_turns_on_adaptive_verification_and_says_the_skip_stands_down(
    mode: str, tiny: TinyModels, caplog: pytest.LogCaptureFixture
) -> None:
    settings = EngineSettings(model=tiny.target, drafter=tiny.drafter, verify_budget=mode)
    with caplog.at_level(logging.WARNING, logger="specgw"):
        args = engine_args(settings, device="cuda")
    assert args.speculative_config["enable_adaptive_verification"] is True
    assert args.additional_config[VERIFY_BUDGET_KEY] == mode  # the worker hook reads it
    assert "skip at depth 0" in caplog.text
    assert "each request's class bound caps its verified drafts" in caplog.text


def test_off_leaves_the_speculative_config_alone(tiny: TinyModels) -> None:
    args = engine_args(EngineSettings(model=tiny.target, drafter=tiny.drafter), device="cuda")
    assert "enable_adaptive_verification" not in args.speculative_config
    assert VERIFY_BUDGET_KEY not in (args.additional_config or {})


def test_the_operators_own_flag_is_said_too(
    tiny: TinyModels, caplog: pytest.LogCaptureFixture
) -> None:
    spec = {
        "method": "eagle3",
        "model": str(tiny.drafter),
        "num_speculative_tokens": 4,
        "enable_adaptive_verification": True,
    }
    settings = EngineSettings(
        model=tiny.target, drafter=tiny.drafter, extra_args={"speculative_config": spec}
    )
    with caplog.at_level(logging.WARNING, logger="specgw"):
        args = engine_args(settings, device="cuda")
    assert "skip at depth 0" in caplog.text
    # Without the verify budget the worker hook stays off: k reaches vLLM as the step's depth.
    assert VERIFY_BUDGET_KEY not in (args.additional_config or {})
    assert "verify_budget=on steers it" in caplog.text
