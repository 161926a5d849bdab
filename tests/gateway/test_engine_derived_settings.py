"""Settings that follow the engine unless set: the served name is the model id as
`--model` gives it (as `vllm serve` names it; the embedded model keeps `specgw-default`),
with aliases, and vLLM is given the same names; `max_running` follows the engine's
`max_num_seqs` (32 on the CPU build)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import resolve


def test_the_served_name_is_the_model_as_given(tmp_path: Path) -> None:
    model = tmp_path / "Llama-3.1-8B-Instruct"
    settings = resolve(["--engine.model", str(model)])
    assert settings.served_model_name == str(model)
    assert settings.engine.served_names() == [str(model)]
    hub = resolve(["--engine.model", "meta-llama/Llama-3.1-8B-Instruct"])
    assert hub.served_names == ["meta-llama/Llama-3.1-8B-Instruct"]


def test_the_embedded_model_keeps_its_name_and_aliases_follow_it() -> None:
    settings = resolve(["--served-model-aliases", "small,tiny"])
    assert settings.served_names == ["specgw-default", "small", "tiny"]
    assert settings.engine.served_names() == ["specgw-default", "small", "tiny"]


def test_an_explicit_name_wins_for_the_gateway_and_vllm_alike(tmp_path: Path) -> None:
    settings = resolve(["--engine.model", str(tmp_path), "--served-model-name", "llama-8b"])
    assert settings.served_names == ["llama-8b"]
    assert settings.engine.served_names() == ["llama-8b"]


def test_the_engine_section_has_no_second_name() -> None:
    from gateway.config import ConfigError

    with pytest.raises(ConfigError, match="unknown setting"):
        resolve(["--engine.served-model-name", "other"])


def test_max_running_follows_max_num_seqs_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve([]).max_running == 32  # the CPU build's max_num_seqs
    assert resolve(["--engine.max-num-seqs", "48"]).max_running == 48
    assert resolve(["--engine.max-num-seqs", "48", "--max-running", "12"]).max_running == 12
    monkeypatch.setenv("SPECGW_MAX_RUNNING", "9")
    assert resolve(["--engine.max-num-seqs", "48"]).max_running == 9


def test_the_embedded_model_named_by_its_directory_keeps_its_name() -> None:
    from engine.model_paths import default_model_paths

    settings = resolve(["--engine.model", str(default_model_paths().target)])
    assert settings.served_names == ["specgw-default"]
