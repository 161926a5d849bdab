"""Backends that plug in by name: each a `module:attribute` string, imported only when
chosen (`importlib`), so the gateway's own modules import no engine library
(`engine.backend` says what such a backend supplies)."""

from __future__ import annotations

import importlib
from typing import cast

from engine.backend import EngineBackend

#: Backend name -> "module:attribute" of its `EngineBackend`.
PLUGINS: dict[str, str] = {"vllm": "engine.vllm.backend:BACKEND"}


def load_backend(name: str) -> EngineBackend:
    """The backend `PLUGINS` names (KeyError: not a plugged-in backend)."""
    module, _, attribute = PLUGINS[name].partition(":")
    return cast(EngineBackend, getattr(importlib.import_module(module), attribute))
