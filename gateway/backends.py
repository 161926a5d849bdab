"""The backend registry: the engine and serving port a gateway runs on, chosen by name.

* `vllm`: the embedded vLLM engine behind vLLM's own OpenAI serving layer
  (`gateway.runtime.real_runtime_factory` on the backend `gateway.plugins` loads by
  its `module:attribute` string, `engine.vllm.backend:BACKEND`; no module here
  imports vLLM).
* `fake`: the scripted `FakeEngine` behind `FakeFrontend`: the whole gateway
  (routes, auth, admission, controller, metrics, flags) with no vLLM engine, for the
  in-process test tier and for trying the gateway without a model.

Both build the same control plane (`gateway.runtime._control_plane`) and the same
engine supervision; only the engine and the port differ. The setting is
`engine.backend` (`SPECGW_ENGINE_BACKEND`, `spec-gateway serve --backend`). A new
engine backend is an `engine.backend.EngineBackend` named in `gateway.plugins.PLUGINS`,
one line in `BACKENDS` (`real_runtime_factory` with its name) and its name in
`EngineSettings.backend` (checked as settings are read; tests/unit/test_backends.py
keeps the two in step).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from typing import Any

from engine.fake import FakeEngine, FakeEngineConfig
from engine.fake_frontend import FakeFrontend, FakeFrontendConfig
from engine.port import ServingPort
from engine.settings import EngineSettings
from gateway.app import RuntimeFactory
from gateway.control.settings import ControllerSettings
from gateway.runtime import Runtime, _control_plane, drafter_name, real_runtime_factory
from gateway.settings import GatewaySettings
from gateway.supervisor import EngineSlot, EngineSupervisor

log = logging.getLogger("specgw")

#: The fake engine's context length where the settings leave it to the model.
FAKE_MAX_MODEL_LEN = 2048

#: (engine settings, controller settings) -> the runtime factory `create_app` takes.
BackendFactory = Callable[[EngineSettings, ControllerSettings | None], RuntimeFactory]


def fake_engine_config(engine_settings: EngineSettings) -> FakeEngineConfig:
    """The fake engine the settings describe: K and the context length carry over."""
    return FakeEngineConfig(
        max_depth=engine_settings.max_depth,
        # No model to read a length from: the embedded model's, unless set.
        max_prompt_tokens=engine_settings.max_model_len or FAKE_MAX_MODEL_LEN,
    )


def fake_runtime_factory(
    engine_settings: EngineSettings,
    controller_settings: ControllerSettings | None = None,
    *,
    engine_config: FakeEngineConfig | None = None,
    frontend_config: FakeFrontendConfig | None = None,
) -> RuntimeFactory:
    """A runtime factory for `create_app` on `FakeEngine` and `FakeFrontend`.

    `engine_config` overrides what `fake_engine_config` derives (acceptance scripts,
    step times): tests script the engine with it; `frontend_config` the serving layer's
    defaults (its served name is always the settings').
    """
    config = engine_config or fake_engine_config(engine_settings)

    @asynccontextmanager
    async def factory(settings: GatewaySettings) -> AsyncIterator[Runtime]:
        @asynccontextmanager
        async def start_engine() -> AsyncIterator[FakeEngine]:
            engine = FakeEngine(config)
            try:
                yield engine
            finally:
                await engine.shutdown()

        async def build_frontend(engine: Any) -> ServingPort:
            served = replace(
                frontend_config or FakeFrontendConfig(),
                served_model_name=settings.served_names[0],
                served_aliases=tuple(settings.served_names[1:]),
            )
            return FakeFrontend(engine, served)

        slot = EngineSlot(start_engine, build_frontend)
        async with AsyncExitStack() as stack:
            await slot.start()
            stack.push_async_callback(slot.close)
            control = controller_settings or ControllerSettings()
            # No vLLM engine here; the drafter label is the configured one, else `fake`.
            drafter = drafter_name(engine_settings.drafter) if engine_settings.drafter else "fake"
            runtime = await _control_plane(
                stack, settings, control, slot, drafter=drafter, vllm_version="none"
            )
            supervisor = EngineSupervisor(
                slot,
                on_down=runtime.engine_down,
                on_up=runtime.engine_up,
                on_fatal=runtime.fatal,
            )
            supervisor.start()
            stack.push_async_callback(supervisor.close)
            log.info("spec-gateway ready on the fake backend (K=%d)", config.max_depth)
            try:
                yield runtime
            finally:
                await runtime.begin_drain()

    return factory


BACKENDS: dict[str, BackendFactory] = {
    "vllm": real_runtime_factory,
    "fake": fake_runtime_factory,
}


def runtime_factory(
    engine_settings: EngineSettings, controller_settings: ControllerSettings | None = None
) -> RuntimeFactory:
    """The runtime factory of the backend `engine_settings.backend` names."""
    name = engine_settings.backend
    backend = BACKENDS.get(name)
    if backend is None:
        known = ", ".join(sorted(BACKENDS))
        raise ValueError(f"unknown engine backend {name!r}; known backends: {known}")
    return backend(engine_settings, controller_settings)
