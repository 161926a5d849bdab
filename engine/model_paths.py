"""Where the committed default model lives, for the engine and the gateway."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class ModelPaths:
    """A built model: the target and its two drafters."""

    root: Path

    @property
    def target(self) -> Path:
        return self.root / "target"

    @property
    def eagle31(self) -> Path:
        return self.root / "eagle3.1"

    @property
    def eagle3(self) -> Path:
        return self.root / "eagle3"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    def exists(self) -> bool:
        return all((p / "config.json").is_file() for p in (self.target, self.eagle31, self.eagle3))


def default_model_root() -> Path:
    """`engine/default_model/`, next to this module (shipped with the code)."""
    return Path(__file__).resolve().parent / "default_model"


def default_model_paths() -> ModelPaths:
    return ModelPaths(default_model_root())


def default_model() -> ModelPaths:
    """Alias of `default_model_paths` (the name the engine tests import)."""
    return default_model_paths()
