"""The build command on the tiny budget: real tokenizer, real training, real files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors import safe_open

from tools.model.build import BuildError, build
from tools.model.chat_template import TOOL_TOKENS
from tools.model.corpus import CorpusError


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("model") / "built"
    return out, build(out, "tiny")


def test_tiny_build_writes_every_artifact(built: tuple[Path, dict[str, Any]]) -> None:
    out, manifest = built
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (out / "target" / name).is_file(), name
    for drafter in ("eagle3.1", "eagle3"):
        assert (out / drafter / "config.json").is_file()
    assert json.loads((out / "manifest.json").read_text()) == json.loads(json.dumps(manifest))
    assert manifest["budget"] == "tiny"
    assert len(manifest["data"]["corpus_sha256"]) == 64
    assert manifest["target"]["result"]["steps"] >= 1
    assert not list(out.parent.glob(".built.building-*")), "temporary build dir left behind"


def test_drafters_differ_only_in_the_eagle31_flags(built: tuple[Path, dict[str, Any]]) -> None:
    out, _ = built
    c31 = json.loads((out / "eagle3.1" / "config.json").read_text())
    c3 = json.loads((out / "eagle3" / "config.json").read_text())
    assert (c31["fc_norm"], c31["norm_output"]) == (True, True)
    assert (c3["fc_norm"], c3["norm_output"]) == (False, False)
    assert len(set(c31["eagle_config"]["eagle_aux_hidden_state_layer_ids"])) == 3
    with safe_open(str(out / "eagle3.1" / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"fc.weight", "norm.weight", "lm_head.weight", "midlayer.hidden_norm.weight"} <= names
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= names
    with safe_open(str(out / "eagle3" / "model.safetensors"), "pt") as f:
        assert not any(k.startswith("fc_norm") for k in f.keys())  # noqa: SIM118


def test_tool_markers_are_single_non_special_tokens(built: tuple[Path, dict[str, Any]]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built[0] / "target"))
    for marker in TOOL_TOKENS:
        ids = tok(marker, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1, marker
        assert tok.decode(ids, skip_special_tokens=True) == marker
    assert tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False,
                                   add_generation_prompt=True)  # fmt: skip
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_bad_output_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="does not exist"):
        build(tmp_path / "missing" / "out", "tiny")
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(BuildError, match="not a directory"):
        build(blocker, "tiny")


def test_missing_corpus_is_a_clear_error_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="standard-library"):
        build(tmp_path / "out", "tiny", stdlib=tmp_path / "empty")
    assert list(tmp_path.iterdir()) == []


def test_reuse_target_trains_only_the_drafters(
    built: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    out, _ = built
    again = build(tmp_path / "again", "tiny", reuse_target=out / "target")
    assert again["target"]["result"]["reused_from"] == str((out / "target").resolve())
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (tmp_path / "again" / "target" / name).read_bytes() == (
            out / "target" / name
        ).read_bytes(), name
    assert again["drafters"]["eagle3.1"]["result"]["steps"] >= 1
    assert (tmp_path / "again" / "eagle3.1" / "model.safetensors").is_file()


def test_reuse_target_without_a_target_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="no built target"):
        build(tmp_path / "out", "tiny", reuse_target=tmp_path)
    assert list(tmp_path.iterdir()) == []
