"""The one place the tests resolve their model: the embedded default model when it is built,
else a tiny random-weight target and EAGLE-3 drafter (built once, under
`$SPECGW_TEST_MODELS`, default /tmp/specgw-tiny).

Engine-tier tests start vLLM on `model_pair()` (or the session fixture `model_pair` in
tests/conftest.py); tests whose assertions need a model that says something
(tool calls, acceptance above chance) skip unless `trained_model()`.
"""

from __future__ import annotations

import fcntl
import functools
import os
from dataclasses import dataclass
from pathlib import Path

from tools.model.testing_models import TinyModels, build_tiny_models


@dataclass(frozen=True, slots=True)
class ModelPair:
    """A target and its drafter, and whether they are the embedded trained pair."""

    target: Path
    drafter: Path
    trained: bool

    @property
    def which(self) -> str:
        return "embedded default model" if self.trained else "tiny random-weight model"


def tiny_models() -> TinyModels:
    """The tiny random-weight pair (built on first use, reused after).

    Under a lock: parallel test workers (`make unit` runs two) must not build it at once.
    """
    root = Path(os.environ.get("SPECGW_TEST_MODELS", "/tmp/specgw-tiny"))
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_tiny_models(root)


def embedded_model() -> ModelPair | None:
    """The embedded default model (target + EAGLE 3.1), or None where it is not built."""
    try:
        from engine.model_paths import default_model_paths
    except ImportError:
        return None
    paths = default_model_paths()
    if not (paths.target.is_dir() and paths.eagle31.is_dir()):
        return None
    return ModelPair(paths.target, paths.eagle31, trained=True)


@functools.cache
def model_pair() -> ModelPair:
    """The embedded model when built, else the tiny pair."""
    embedded = embedded_model()
    if embedded is not None:
        return embedded
    tiny = tiny_models()
    return ModelPair(tiny.target, tiny.drafter, trained=False)


def trained_model() -> bool:
    """True when the tests run on the embedded trained model (no tiny pair is built)."""
    return embedded_model() is not None
