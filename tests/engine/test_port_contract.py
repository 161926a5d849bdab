"""The serving-port contract (`port_contract.py`) on each backend's port, built by its plugin.

Each backend is loaded from the registry (`engine.backend.PLUGINS`) and started as the
gateway starts it: `start_engine(settings)`, then `serving_port(engine, config)`. The fake
runs in the unit tier; vLLM's serving layer on the embedded engine (or the tiny model) is
the `engine` parametrisation, in the engine tier.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from engine.backend import PortConfig, load_backend
from engine.settings import EngineSettings
from tests.engine.port_contract import PORT_CONTRACT, PortHarness

pytestmark = pytest.mark.asyncio(loop_scope="session")

SERVED = "specgw-contract"


def _settings(backend: str) -> EngineSettings:
    if backend == "fake":
        return EngineSettings(backend="fake", max_depth=4, max_model_len=512)
    from tests.engine.engines import engine_settings

    return engine_settings()


async def _started(backend: str) -> AsyncIterator[PortHarness]:
    plugin = load_backend(backend)
    settings = _settings(backend)
    target, _ = settings.resolved_models()
    config = PortConfig(model=str(target), served_model_name=SERVED)
    async with plugin.start_engine(settings) as engine:
        port = await plugin.serving_port(engine, config)
        max_model_len = settings.max_model_len
        assert max_model_len is not None
        yield PortHarness(port, engine.max_depth, max_model_len, engine.outcome_tap)


@pytest_asyncio.fixture(
    scope="module",
    loop_scope="session",
    params=["fake", pytest.param("vllm", marks=pytest.mark.engine)],
)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[PortHarness]:
    async for started in _started(request.param):
        yield started


@pytest.mark.parametrize("check", sorted(PORT_CONTRACT))
async def test_port_contract(harness: PortHarness, check: str) -> None:
    await PORT_CONTRACT[check](harness)
    assert len(harness.tap) == 0, "every outcome resolved once its request ended"
