"""Engine fixtures: the tiny random-weight models, and the engine tier's shared in-process
vLLM engines.

`speculative_engine` (K = 4, `engine_settings()`) serves every module of this package
that needs the engine as it starts and nothing it may kill: a start is two spawned vLLM
imports and a model load, most of a module's time. Its modules read what they count as
deltas or key it by their own request ids and prompts.

Only one in-process engine may run at a time: a vLLM engine's start unregisters every
`vllm:` collector already in the process's Prometheus registry
(`vllm.v1.metrics.prometheus.unregister_vllm_metrics`), so the shared engine's counters
would vanish under its modules. Hence the greedy references of an engine without a
drafter are taken before it starts, and the modules on the shared engine run last in
this package (`pytest_collection_modifyitems`), after those that start engines of their
own, and the one that kills its core (test_engine_death) after all of them; the package
scope shuts it down once they are done.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import pytest_asyncio

from tests.models import tiny_models
from tools.model.testing_models import TinyModels

if TYPE_CHECKING:
    from engine.vllm.engine import VLLMEngine

SHARED = "speculative_engine"
_PACKAGE = Path(__file__).resolve().parent
#: Greedy references run at this many tokens; the tests compare their outputs with them.
REFERENCE_TOKENS = 48


@pytest.fixture(scope="session")
def tiny() -> TinyModels:
    return tiny_models()


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def greedy_reference() -> dict[str, list[int]]:
    """`GREEDY_PROMPTS`' greedy tokens on an engine without a drafter, stopped before the
    shared speculative engine starts."""
    from engine.interface import GenerateRequest
    from engine.vllm.engine import VLLMEngine
    from tests.engine.contract import collect
    from tests.engine.engines import GREEDY_PROMPTS, engine_settings

    async def greedy(engine: VLLMEngine, i: int, prompt: str) -> list[int]:
        request = GenerateRequest(
            request_id=f"ref-{i}", prompt=prompt, max_tokens=REFERENCE_TOKENS, k=0
        )
        chunks, _ = await collect(engine, request)
        return [t for c in chunks for t in c.token_ids_delta]

    async with VLLMEngine.started(engine_settings(speculative=False)) as engine:
        assert engine.max_depth == 0
        outs = await asyncio.gather(*(greedy(engine, i, p) for i, p in enumerate(GREEDY_PROMPTS)))
    return dict(zip(GREEDY_PROMPTS, outs, strict=True))


@pytest_asyncio.fixture(scope="package", loop_scope="session")
async def speculative_engine(greedy_reference: dict[str, list[int]]) -> AsyncIterator[VLLMEngine]:
    """The shared K = 4 engine (`engine_settings()`); after `greedy_reference`, see above."""
    from engine.vllm.engine import VLLMEngine
    from tests.engine.engines import engine_settings

    async with VLLMEngine.started(engine_settings()) as engine:
        yield engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """This package's tests on the shared engine last, the one that kills it at the very
    end, each group in collection order; every other test keeps its place."""
    here = [i for i, item in enumerate(items) if _in_this_package(item)]
    mine = [items[i] for i in here]
    ordered = sorted(mine, key=_turn)  # stable: collection order within each turn
    for slot, item in zip(here, ordered, strict=True):
        items[slot] = item


def _turn(item: pytest.Item) -> int:
    """0: its own engine or none; 1: on the shared engine; 2: ends it (a module that kills
    the shared engine's core says so with `ENDS_SHARED_ENGINE = True`)."""
    if SHARED not in _fixtures(item):
        return 0
    return 2 if getattr(getattr(item, "module", None), "ENDS_SHARED_ENGINE", False) else 1


def _in_this_package(item: pytest.Item) -> bool:
    return item.path.parent == _PACKAGE


def _fixtures(item: pytest.Item) -> list[str]:
    return list(getattr(item, "fixturenames", ()))
