"""Model paths for the engine tests: the embedded default model when built, else tiny ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from engine.testing_models import TinyModels, build_tiny_models


def tiny_models() -> TinyModels:
    return build_tiny_models(Path(os.environ.get("SPECGW_TEST_MODELS", "/tmp/specgw-tiny")))


def engine_models() -> tuple[Path, Path, str]:
    """(target, drafter, which): the real embedded model when its artifacts exist."""
    try:
        from engine.model.paths import default_model
    except ImportError:
        pass
    else:
        paths = default_model()
        if paths.target.is_dir() and paths.eagle31.is_dir():
            return paths.target, paths.eagle31, "embedded default model"
    tiny = tiny_models()
    return tiny.target, tiny.drafter, "tiny random-weight model"


@pytest.fixture(scope="session")
def tiny() -> TinyModels:
    return tiny_models()
