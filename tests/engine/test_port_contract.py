"""The serving-port contract (`port_contract.py`) on each backend's port.

The fake runs in the unit tier; vLLM's serving layer on the embedded engine (or the
tiny model) is the `engine` parametrisation, in the engine tier.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from engine.fake import FakeEngine, FakeEngineConfig
from engine.fake_frontend import FakeFrontend, FakeFrontendConfig
from tests.engine.port_contract import PORT_CONTRACT, PortHarness

pytestmark = pytest.mark.asyncio(loop_scope="session")

SERVED = "specgw-contract"


async def _fake() -> AsyncIterator[PortHarness]:
    config = FakeEngineConfig(max_depth=4, max_prompt_tokens=512)
    engine = FakeEngine(config)
    port = FakeFrontend(engine, FakeFrontendConfig(served_model_name=SERVED))
    yield PortHarness(port, 4, 512, engine.outcome_tap)
    await engine.shutdown()


async def _vllm() -> AsyncIterator[PortHarness]:
    from engine.vllm.engine import VLLMEngine
    from engine.vllm.openai_frontend import FrontendConfig, OpenAIFrontend
    from tests.engine.engines import engine_settings

    settings = engine_settings()
    async with VLLMEngine.started(settings) as engine:
        target, _ = settings.resolved_models()
        config = FrontendConfig(model=str(target), served_model_name=SERVED)
        port = await OpenAIFrontend.create(
            engine.serving_client,
            config,
            lossless_sampling=engine.lossless_sampling,
            outcomes=engine.outcome_tap,
        )
        yield PortHarness(port, engine.max_depth, settings.max_model_len, engine.outcome_tap)


@pytest_asyncio.fixture(
    scope="module",
    loop_scope="session",
    params=["fake", pytest.param("vllm", marks=pytest.mark.engine)],
)
async def harness(request: pytest.FixtureRequest) -> AsyncIterator[PortHarness]:
    backend = _fake if request.param == "fake" else _vllm
    async for started in backend():
        yield started


@pytest.mark.parametrize("check", sorted(PORT_CONTRACT))
async def test_port_contract(harness: PortHarness, check: str) -> None:
    await PORT_CONTRACT[check](harness)
    assert len(harness.tap) == 0, "every outcome resolved once its request ended"
