"""The tiny random-weight models, for engine tests that build vLLM objects on them."""

from __future__ import annotations

import pytest

from tests.models import tiny_models
from tools.model.testing_models import TinyModels


@pytest.fixture(scope="session")
def tiny() -> TinyModels:
    return tiny_models()
