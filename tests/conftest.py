"""Suite-wide fixtures and hooks: a real redis-server on loopback (tests/redis_fixtures.py),
the unit tier's no-engine guard (tests/tier_guard.py), and the model the engine tier runs
(tests/models.py)."""

from __future__ import annotations

import pytest

from tests.models import ModelPair, model_pair

pytest_plugins = ["tests.redis_fixtures", "tests.tier_guard"]


@pytest.fixture(scope="session")
def models() -> ModelPair:
    """The target and drafter engine-tier tests run on (tests/models.py)."""
    return model_pair()
