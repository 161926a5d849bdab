"""The backend registry: each backend by name, as a `module:attribute` string (`PLUGINS`).

A backend is an `EngineBackend`: its engine, the serving port on it, the checks before
both. It is named here as text and imported only when chosen (`load_backend`), so no
gateway module imports an engine library, even indirectly: the import contracts in
pyproject.toml let the gateway reach vLLM only through `engine.protocol` (the wire
models) and the serving port. Importing a backend module must be cheap (`spec-gateway
--version` reads `library_version`): the engine library is imported inside the methods.
`EngineSettings.backend` accepts the names registered here; adding a backend is one
line in `PLUGINS`, and its port passes tests/engine/port_contract.py.
"""

from __future__ import annotations

import importlib
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast

from engine.interface import EngineError

if TYPE_CHECKING:
    from engine.port import ServingPort


@dataclass(frozen=True, slots=True)
class PortConfig:
    """What the gateway tells a backend's serving port: the model and the name it serves."""

    model: str
    served_model_name: str
    #: Further names the model answers to; answers report `served_model_name`.
    served_aliases: tuple[str, ...] = ()
    #: `/v1/completions` prompts are raw by design (a client may write the template's
    #: markers on purpose); True reads their control-token strings as text too.
    split_completion_prompts: bool = False


class PreflightError(EngineError):
    """The backend cannot start as configured (an untested library version, a missing
    model, a drafter that does not fit): one line, said before anything starts."""


class EngineBackend(Protocol):
    """One backend: its engine, the serving port on it, and the checks before both."""

    def library_version(self) -> str | None:
        """The installed engine library's version (None: not installed), read without
        importing the library."""
        ...

    def preflight(self, engine_settings: Any) -> None:
        """Raise `PreflightError` where the settings cannot start an engine."""
        ...

    def startup_plan(
        self, engine_settings: Any, max_running: int | None, gpu_memory_gib: float
    ) -> str:
        """What the engine would run, as text, without starting it (`spec-gateway plan`);
        `PreflightError` where it would refuse to start or lose a feature silently.
        `max_running`: the gateway's admission bound (None: it follows `max_num_seqs`)."""
        ...

    def start_engine(self, engine_settings: Any) -> AbstractAsyncContextManager[Any]:
        """Start an engine (`engine.interface.Engine`); shut it down on exit."""
        ...

    async def serving_port(self, engine: Any, config: PortConfig) -> ServingPort:
        """The serving port on a started engine; the engine resolves the outcome of each
        of its answers (`engine.outcomes`)."""
        ...


#: Backend name -> "module:attribute" of its `EngineBackend`.
PLUGINS: dict[str, str] = {
    # The embedded vLLM engine behind vLLM's own OpenAI serving layer.
    "vllm": "engine.vllm.backend:BACKEND",
    # The scripted engine: the in-process test tier, trials without a model.
    "fake": "engine.fake_backend:BACKEND",
}


def load_backend(name: str) -> EngineBackend:
    """The backend `PLUGINS` names; ValueError naming the known ones for any other."""
    if name not in PLUGINS:
        known = ", ".join(sorted(PLUGINS))
        raise ValueError(f"unknown engine backend {name!r}; known backends: {known}")
    module, _, attribute = PLUGINS[name].partition(":")
    return cast(EngineBackend, getattr(importlib.import_module(module), attribute))


__all__ = ["PLUGINS", "EngineBackend", "PortConfig", "PreflightError", "load_backend"]
