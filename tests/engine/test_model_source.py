"""Model sources and the drafter/target fit (`engine.vllm.model_source`), on small config.json
files in temporary directories: no download, no engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.vllm.model_source import (
    ModelSource,
    ModelSourceError,
    check_fit,
    drafter_shape,
    hub_token,
    model_source,
    read_config,
)

TARGET = {"hidden_size": 4096, "vocab_size": 128256, "num_hidden_layers": 32}
EAGLE3 = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "hidden_size": 4096,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
    "target_hidden_size": 4096,
}
SPECULATORS = {
    "speculators_model_type": "eagle3",
    "speculators_config": {
        "proposal_methods": [{"speculative_tokens": 3}],
        "verifier": {"name_or_path": "meta-llama/Llama-3.1-8B-Instruct"},
    },
    "transformer_layer_config": {"hidden_size": 4096, "vocab_size": 128256},
    "draft_vocab_size": 32000,
    "eagle_aux_hidden_state_layer_ids": [1, 15, 28],
}


def _model(root: Path, name: str, config: dict[str, Any]) -> ModelSource:
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return model_source(path, "drafter" if name != "target" else "target")


def _fit(tmp_path: Path, target: dict[str, Any], drafter: dict[str, Any]) -> None:
    t, d = _model(tmp_path, "target", target), _model(tmp_path, "drafter", drafter)
    check_fit(t, read_config(t, None), d, read_config(d, None))


@pytest.mark.parametrize("drafter", [EAGLE3, SPECULATORS], ids=["eagle3", "speculators"])
def test_a_drafter_that_fits_passes(tmp_path: Path, drafter: dict[str, Any]) -> None:
    _fit(tmp_path, TARGET, drafter)


def test_the_speculators_layout_is_read_from_its_own_fields() -> None:
    shape = drafter_shape(SPECULATORS, "x")
    assert (shape.layout, shape.target_hidden_size, shape.vocab_size) == (
        "speculators",
        4096,
        128256,
    )
    assert (shape.draft_vocab_size, shape.aux_layers) == (32000, (1, 15, 28))
    nested = {**EAGLE3, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 9, 20]}}
    assert drafter_shape(nested, "x").aux_layers == (2, 9, 20)


@pytest.mark.parametrize(
    ("target", "drafter", "says"),
    [
        (TARGET, {**EAGLE3, "target_hidden_size": 5120}, "hidden size 5120"),
        (TARGET, {**EAGLE3, "vocab_size": 151936}, "vocab_size 151936"),
        (TARGET, {**EAGLE3, "draft_vocab_size": 200000}, "draft_vocab_size 200000"),
        (
            TARGET,
            {**SPECULATORS, "eagle_aux_hidden_state_layer_ids": [1, 15, 40]},
            "eagle_aux_hidden_state_layer_ids [1, 15, 40]",
        ),
        (TARGET, {**EAGLE3, "eagle_aux_hidden_state_layer_ids": [3, 3, 9]}, "distinct"),
        ({**TARGET, "num_hidden_layers": 4}, EAGLE3, "repeats a layer"),
        (TARGET, {**EAGLE3, "architectures": ["LlamaForCausalLM"]}, "not an EAGLE-3 drafter"),
        (TARGET, {**SPECULATORS, "speculators_model_type": "dflash"}, "'dflash'"),
        (TARGET, {**EAGLE3, "vocab_size": None}, "no positive integer vocab_size"),
    ],
)
def test_a_drafter_that_does_not_fit_is_one_line(
    tmp_path: Path, target: dict[str, Any], drafter: dict[str, Any], says: str
) -> None:
    with pytest.raises(ModelSourceError) as err:
        _fit(tmp_path, target, drafter)
    message = str(err.value)
    assert says in message
    assert "\n" not in message
    assert str(tmp_path / "drafter") in message


def test_a_multimodal_target_is_read_from_its_text_config(tmp_path: Path) -> None:
    _fit(tmp_path, {"text_config": TARGET, "vision_config": {"hidden_size": 1152}}, EAGLE3)


@pytest.mark.parametrize(
    ("ref", "local"),
    [("meta-llama/Llama-3.1-8B-Instruct", False), ("RedHatAI/x.eagle3-v1_2", False)],
)
def test_hub_ids_are_sources(ref: str, local: bool) -> None:
    source = model_source(ref, "target")
    assert (source.ref, source.local is not None) == (ref, local)


@pytest.mark.parametrize("ref", ["/no/such/model", "./rel/path/x", "a/b/c", "just-a-name"])
def test_a_missing_model_is_one_line(ref: str) -> None:
    with pytest.raises(ModelSourceError, match=r"^target not found: .* neither a model directory"):
        model_source(ref, "target")


def test_a_directory_without_config_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match=r"no config\.json"):
        model_source(tmp_path, "drafter")


def test_the_token_comes_from_the_environment_then_the_token_file(tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("hf_fromfile\n", encoding="utf-8")
    assert hub_token({"HF_TOKEN": " hf_env "}) == "hf_env"
    assert hub_token({"HF_TOKEN_PATH": str(secret)}) == "hf_fromfile"
    assert hub_token({"HF_TOKEN": "hf_env", "HF_TOKEN_PATH": str(secret)}) == "hf_env"
    assert hub_token({}) is None
    with pytest.raises(ModelSourceError, match=r"HF_TOKEN_PATH .* no such file"):
        hub_token({"HF_TOKEN_PATH": str(tmp_path / "absent")})
