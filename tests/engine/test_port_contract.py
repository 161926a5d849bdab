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
    harness = PortHarness(port=None, max_depth=4, max_model_len=512)  # type: ignore[arg-type]
    config = FakeEngineConfig(max_depth=harness.max_depth, max_prompt_tokens=512)
    engine = FakeEngine(config, on_outcome=harness.deliver)
    harness.port = FakeFrontend(engine, FakeFrontendConfig(served_model_name=SERVED))
    yield harness
    await engine.shutdown()


async def _vllm() -> AsyncIterator[PortHarness]:
    from engine.vllm.engine import VLLMEngine
    from engine.vllm.openai_frontend import FrontendConfig, OpenAIFrontend
    from tests.engine.engines import engine_settings

    settings = engine_settings()
    harness = PortHarness(port=None, max_depth=4, max_model_len=settings.max_model_len)  # type: ignore[arg-type]
    async with VLLMEngine.started(settings, on_outcome=harness.deliver) as engine:
        target, _ = settings.resolved_models()
        config = FrontendConfig(model=str(target), served_model_name=SERVED)
        harness.port = await OpenAIFrontend.create(
            engine.serving_client, config, lossless_sampling=engine.lossless_sampling
        )
        harness.max_depth = engine.max_depth
        yield harness


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
