"""Where the target and the drafter come from, and whether the drafter fits the target.

A GPU user names models the way vLLM takes them: a local directory or a Hugging
Face id (`org/name`), with a token from `HF_TOKEN` or from the file that
`HF_TOKEN_PATH` names (Hugging Face's own variables, so vLLM's downloads and its
workers read the same token; a Kubernetes secret is mounted as that file).

An EAGLE-3 drafter reads the target's hidden states at three layers and shares
its vocabulary, so a drafter trained for another target fails deep inside vLLM,
or loads and accepts nothing. Its `config.json` says what it expects, in one of
two layouts vLLM reads (`vllm/transformers_utils/configs/speculators/`):

* EAGLE-3 (`architectures` naming an Eagle3 class): `target_hidden_size` (else
  `hidden_size`), `vocab_size`, `draft_vocab_size`, and the target layers in
  `eagle_aux_hidden_state_layer_ids` or `eagle_config` of the same name;
* speculators (`speculators_config` present, `speculators_model_type: eagle3`):
  the same keys at the top level, the layer's shape in `transformer_layer_config`.

Without explicit layers vLLM uses (2, L // 2, L - 3) of an L-layer target
(`SupportsEagle3.get_eagle3_default_aux_hidden_state_layers`), which repeats a
layer below 7 layers. Every problem is one line naming the model and the field.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: `org/name` as the Hugging Face Hub spells a model id.
HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ModelSourceError(ValueError):
    """A model that cannot be found, read, or paired; the message is one line."""


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A model as vLLM will be given it: `ref`, and its directory when it is local."""

    role: str
    ref: str
    local: Path | None


def model_source(ref: Path | str, role: str) -> ModelSource:
    """A local model directory or a Hugging Face id; anything else is refused."""
    text = str(ref)
    path = Path(text).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelSourceError(f"{role} {path}: no config.json (not a model directory)")
        return ModelSource(role, str(path), path)
    if path.exists():
        raise ModelSourceError(f"{role} {path}: a file, not a model directory")
    if HF_ID.match(text) and not text.startswith((".", "~")):
        return ModelSource(role, text, None)
    raise ModelSourceError(
        f"{role} not found: {text} is neither a model directory nor a Hugging Face id (org/name)"
    )


def hub_token(environ: Mapping[str, str]) -> str | None:
    """`HF_TOKEN` (or the older `HUGGING_FACE_HUB_TOKEN`), else the `HF_TOKEN_PATH` file."""
    token = environ.get("HF_TOKEN") or environ.get("HUGGING_FACE_HUB_TOKEN")
    if token and token.strip():
        return token.strip()
    path = environ.get("HF_TOKEN_PATH")
    if not path:
        return None
    file = Path(path)
    if not file.is_file():
        raise ModelSourceError(f"HF_TOKEN_PATH {path}: no such file (the mounted token secret?)")
    return file.read_text(encoding="utf-8").strip() or None


def read_config(source: ModelSource, token: str | None) -> dict[str, Any]:
    """The model's `config.json`: from its directory, or downloaded from the Hub."""
    if source.local is not None:
        file = source.local / "config.json"
    else:
        file = _download_config(source, token)
    try:
        loaded = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelSourceError(
            f"{source.role} {source.ref}: config.json unreadable: {exc}"
        ) from exc
    if not isinstance(loaded, dict):
        raise ModelSourceError(f"{source.role} {source.ref}: config.json is not an object")
    return loaded


def _download_config(source: ModelSource, token: str | None) -> Path:
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(source.ref, "config.json", token=token))
    except Exception as exc:  # the Hub's errors: missing, gated, offline, HTTP
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ModelSourceError(
            f"{source.role} {source.ref}: not found on the Hugging Face Hub or not readable "
            f"({type(exc).__name__}: {first[:160]}); set HF_TOKEN for a gated model"
        ) from exc


@dataclass(frozen=True, slots=True)
class TargetShape:
    hidden_size: int
    vocab_size: int
    num_layers: int


@dataclass(frozen=True, slots=True)
class DrafterShape:
    layout: str
    target_hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    aux_layers: tuple[int, ...] | None


def target_shape(config: Mapping[str, Any], ref: str) -> TargetShape:
    """Hidden size, vocabulary and depth of a target (`text_config` for multimodal ones)."""
    text = config.get("text_config") or config
    return TargetShape(
        hidden_size=_int_field(text, "hidden_size", f"target {ref}"),
        vocab_size=_int_field(text, "vocab_size", f"target {ref}"),
        num_layers=_int_field(text, "num_hidden_layers", f"target {ref}"),
    )


def drafter_shape(config: Mapping[str, Any], ref: str) -> DrafterShape:
    """What an EAGLE-3 drafter expects of its target, from either config layout."""
    where = f"drafter {ref}"
    body: Mapping[str, Any]
    if "speculators_config" in config:
        method = config.get("speculators_model_type")
        if method != "eagle3":
            raise ModelSourceError(
                f"{where}: speculators_model_type {method!r}; spec-gateway drafts with eagle3"
            )
        layer = config.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise ModelSourceError(f"{where}: speculators config without transformer_layer_config")
        layout, body, aux = "speculators", layer, config.get("eagle_aux_hidden_state_layer_ids")
    else:
        archs = config.get("architectures") or []
        if not any("eagle3" in str(a).lower() for a in archs):
            raise ModelSourceError(
                f"{where}: architectures {archs} is not an EAGLE-3 drafter "
                "(nor a speculators config with speculators_config)"
            )
        eagle = config.get("eagle_config") or {}
        layout, body = "eagle3", config
        aux = config.get("eagle_aux_hidden_state_layer_ids") or eagle.get(
            "eagle_aux_hidden_state_layer_ids"
        )
    vocab = _int_field(body, "vocab_size", where)
    hidden = config.get("target_hidden_size") or _int_field(body, "hidden_size", where)
    return DrafterShape(
        layout=layout,
        target_hidden_size=int(hidden),
        vocab_size=vocab,
        draft_vocab_size=int(config.get("draft_vocab_size") or vocab),
        aux_layers=tuple(int(i) for i in aux) if aux else None,
    )


def fit_problem(target: TargetShape, drafter: DrafterShape) -> str | None:
    """Why the drafter cannot draft for the target (one reason), or None."""
    if drafter.target_hidden_size != target.hidden_size:
        return (
            f"hidden size {drafter.target_hidden_size} (target_hidden_size) is not the "
            f"target's {target.hidden_size}"
        )
    if drafter.vocab_size != target.vocab_size:
        return f"vocab_size {drafter.vocab_size} is not the target's {target.vocab_size}"
    if drafter.draft_vocab_size > target.vocab_size:
        return f"draft_vocab_size {drafter.draft_vocab_size} exceeds the target's vocabulary"
    layers = target.num_layers
    aux = drafter.aux_layers
    if aux is None:
        default = (2, layers // 2, layers - 3)
        if len(set(default)) < 3 or min(default) < 0:
            return (
                f"no eagle_aux_hidden_state_layer_ids, and vLLM's default {default} for a "
                f"{layers}-layer target repeats a layer: set three distinct layers"
            )
        return None
    if len(set(aux)) != len(aux) or not all(0 <= i < layers for i in aux):
        return (
            f"eagle_aux_hidden_state_layer_ids {list(aux)} must be distinct layers of the "
            f"{layers}-layer target (0..{layers - 1})"
        )
    return None


def check_fit(
    target: ModelSource,
    target_config: Mapping[str, Any],
    drafter: ModelSource,
    drafter_config: Mapping[str, Any],
) -> None:
    """Refuse a drafter that does not fit its target, naming both and the field."""
    problem = fit_problem(
        target_shape(target_config, target.ref), drafter_shape(drafter_config, drafter.ref)
    )
    if problem is not None:
        raise ModelSourceError(f"drafter {drafter.ref} does not fit target {target.ref}: {problem}")


def _int_field(config: Mapping[str, Any], key: str, where: str) -> int:
    value = config.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ModelSourceError(f"{where}: config.json has no positive integer {key}")
    return value


__all__ = [
    "DrafterShape",
    "ModelSource",
    "ModelSourceError",
    "TargetShape",
    "check_fit",
    "drafter_shape",
    "fit_problem",
    "hub_token",
    "model_source",
    "read_config",
    "target_shape",
]
