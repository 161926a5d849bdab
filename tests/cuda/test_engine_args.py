"""The engine arguments the gateway builds (`engine.vllm.engine.engine_args`), validated by
vLLM 0.33's own config classes (`AsyncEngineArgs.create_engine_config`: model, speculative,
scheduler and compilation configs), without creating a model; and a drafter in the
speculators layout, read by vLLM's own parser and by `engine.vllm.model_source`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.settings import EngineSettings
from engine.vllm.engine_args import engine_args
from engine.vllm.model_source import check_fit, model_source, read_config
from engine.vllm.preflight import EngineSettingsError, check_schedule
from engine.vllm.scheduler import AutoSpecDepthScheduler
from tools.model.testing_models import TinyModels


def _config(settings: EngineSettings) -> Any:
    return engine_args(settings).create_engine_config()


def test_the_default_arguments_validate(tiny: TinyModels) -> None:
    config = _config(EngineSettings(model=tiny.target, drafter=tiny.drafter, max_depth=3))
    spec = config.speculative_config
    assert (spec.method, spec.num_speculative_tokens) == ("eagle3", 3)
    assert config.scheduler_config.get_scheduler_cls() is AutoSpecDepthScheduler
    assert config.parallel_config.worker_extension_cls == "engine.vllm.worker.SpecGatewayWorker"
    assert config.observability_config.per_request_spec_decode_metrics == "detailed"


@pytest.mark.parametrize(("flavour", "async_scheduling"), [("sync", False), ("async", True)])
def test_a_forced_scheduler_flavour_validates(
    flavour: str, async_scheduling: bool, tiny: TinyModels
) -> None:
    settings = EngineSettings(model=tiny.target, drafter=tiny.drafter, scheduler=flavour)
    args = engine_args(settings)
    assert args.async_scheduling is async_scheduling
    args.create_engine_config()


def test_the_batch_size_schedule_validates(tiny: TinyModels) -> None:
    settings = EngineSettings(
        model=tiny.target,
        drafter=tiny.drafter,
        max_depth=3,
        spec_tokens_per_batch_size=[(1, 1, 3), (2, 8, 2), (9, 1024, 1)],
    )
    spec = _config(settings).speculative_config
    assert spec.uses_dynamic_speculative_decoding()


def test_a_schedule_vllm_refuses_only_in_its_engine_core_is_refused_at_start(
    tiny: TinyModels,
) -> None:
    """vLLM's config takes a schedule without batch size 1; its scheduler would refuse it in
    the engine core. The settings accept it too, so the preflight says it in one line."""
    settings = EngineSettings(
        model=tiny.target, drafter=tiny.drafter, spec_tokens_per_batch_size=[(2, 8, 2)]
    )
    _config(settings)
    with pytest.raises(EngineSettingsError, match=r"^spec_tokens_per_batch_size: .*start at 1"):
        check_schedule(settings)


def _speculators_drafter(tiny: TinyModels, root: Path) -> Path:
    """The tiny EAGLE 3.1 drafter's config in the speculators layout (config only)."""
    eagle = json.loads((tiny.drafter / "config.json").read_text(encoding="utf-8"))
    layer = {k: v for k, v in eagle.items() if k not in {"eagle_config", "architectures"}}
    layer["architectures"] = ["LlamaForCausalLM"]
    config = {
        "speculators_model_type": "eagle3",
        "architectures": ["Eagle3Speculator"],
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": str(tiny.target), "architectures": ["LlamaForCausalLM"]},
        },
        "transformer_layer_config": layer,
        "draft_vocab_size": eagle["draft_vocab_size"],
        "target_hidden_size": eagle["target_hidden_size"],
        "norm_before_residual": True,
        "fc_norm": True,
        "norm_output": True,
        "eagle_aux_hidden_state_layer_ids": eagle["eagle_config"][
            "eagle_aux_hidden_state_layer_ids"
        ],
    }
    out = root / "speculators"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return out


def test_a_speculators_drafter_is_read_by_vllm_and_fits(tmp_path: Path, tiny: TinyModels) -> None:
    drafter = _speculators_drafter(tiny, tmp_path)
    target, source = model_source(tiny.target, "target"), model_source(drafter, "drafter")
    check_fit(target, read_config(target, None), source, read_config(source, None))
    config = _config(EngineSettings(model=tiny.target, drafter=drafter, max_depth=3))
    spec = config.speculative_config
    assert (spec.method, spec.num_speculative_tokens) == ("eagle3", 3)
    draft = spec.draft_model_config.hf_config
    assert list(draft.eagle_aux_hidden_state_layer_ids) == [0, 2, 3]
    assert draft.fc_norm is True
