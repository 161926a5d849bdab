"""Suite-wide fixtures and hooks: a real redis-server on loopback (tests/redis_fixtures.py),
the engine tier's shared gateway processes (tests/gateway_fixtures.py), the unit tier's
no-engine guard (tests/tier_guard.py), and the model the engine tier runs (tests/models.py)."""

from __future__ import annotations

import gc

import pytest

from tests.models import ModelPair, model_pair

pytest_plugins = ["tests.redis_fixtures", "tests.gateway_fixtures", "tests.tier_guard"]


@pytest.fixture(scope="session")
def models() -> ModelPair:
    """The target and drafter engine-tier tests run on (tests/models.py)."""
    return model_pair()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection imported, as the gateway freezes its start-up heap
    (`gateway.runtime.freeze_startup_heap`): a full collection over the libraries'
    objects otherwise pauses whichever test is running for about 0.5 s, and a test
    that bounds a wait in wall time reads the pause as the wait. Not imported from the
    gateway: this conftest must import nothing that imports vLLM before `tests/cuda`
    picks its platform."""
    gc.collect()
    gc.freeze()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Give the frozen objects back to the collector, so that the interpreter's exit
    frees them (nanobind reports a binding whose objects outlive it as leaked)."""
    gc.unfreeze()
