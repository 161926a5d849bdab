"""The fake backend as the gateway loads it (`engine.fake_backend:BACKEND`), like vLLM's.

The scripted `FakeEngine` behind `FakeFrontend`: the whole gateway (routes, auth,
admission, controller, metrics, flags) with no model and no engine library, for the
in-process test tier and for trying the gateway (`spec-gateway serve --backend fake`).
Tests script it with a `FakeBackend` of their own: its engine (acceptance scripts, step
times) and its serving layer's defaults (the served names are always the gateway's).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from engine.backend import PortConfig
from engine.fake import FakeEngine, FakeEngineConfig
from engine.fake_frontend import FakeFrontend, FakeFrontendConfig
from engine.port import ServingPort

#: The fake engine's context length where the settings leave it to the model.
FAKE_MAX_MODEL_LEN = 2048


def fake_engine_config(engine_settings: Any) -> FakeEngineConfig:
    """The fake engine the settings describe: K and the context length carry over."""
    return FakeEngineConfig(
        max_depth=engine_settings.max_depth,
        # No model to read a length from: the embedded model's, unless set.
        max_prompt_tokens=engine_settings.max_model_len or FAKE_MAX_MODEL_LEN,
    )


@dataclass(frozen=True, slots=True)
class FakeBackend:
    """`engine.backend.EngineBackend` on the scripted engine."""

    #: The engine to run; None: the one the settings describe (`fake_engine_config`).
    engine: FakeEngineConfig | None = None
    #: The serving layer's defaults (its served names are replaced by the gateway's).
    frontend: FakeFrontendConfig = field(default_factory=FakeFrontendConfig)

    def library_version(self) -> str | None:
        """No engine library."""
        return None

    def preflight(self, engine_settings: Any) -> None:
        """Nothing to refuse: there is no model to load."""

    def startup_plan(
        self, engine_settings: Any, max_running: int | None, gpu_memory_gib: float
    ) -> str:
        config = self.engine or fake_engine_config(engine_settings)
        return (
            f"fake engine (no model, no engine library): K={config.max_depth}, "
            f"context {config.max_prompt_tokens} tokens\n"
        )

    def start_engine(self, engine_settings: Any) -> AbstractAsyncContextManager[FakeEngine]:
        config = self.engine or fake_engine_config(engine_settings)

        @asynccontextmanager
        async def started() -> AsyncIterator[FakeEngine]:
            engine = FakeEngine(config)
            try:
                yield engine
            finally:
                await engine.shutdown()

        return started()

    async def serving_port(self, engine: Any, config: PortConfig) -> ServingPort:
        served = replace(
            self.frontend,
            served_model_name=config.served_model_name,
            served_aliases=config.served_aliases,
        )
        return FakeFrontend(engine, served)


BACKEND = FakeBackend()
