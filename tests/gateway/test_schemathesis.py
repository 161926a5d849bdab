"""Property-based API testing of the OpenAPI document, in-process on the real engine.

schemathesis drives the ASGI app directly (one lifespan, so one real vLLM engine
for the whole run) and checks every response: no 5xx, status codes and bodies as
documented. Generated `max_tokens` are clamped so that 500+ cases stay fast.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from gateway.auth import digest
from gateway.settings import GatewaySettings
from tests.gateway.conftest import USER_KEY, model_paths

pytestmark = pytest.mark.engine

# Issue 4 asks for at least 500 generated cases: the two completion routes alone make them.
CASES = {"POST /v1/chat/completions": 350, "POST /v1/completions": 150}
OTHER = 25


def _app() -> Any:
    from engine.settings import EngineSettings
    from gateway.app import create_app
    from gateway.runtime import real_runtime_factory

    target, drafter = model_paths()
    engine_settings = EngineSettings(model=target, drafter=drafter, kv_cache_gib=1)
    gateway_settings = GatewaySettings(api_keys=[digest(USER_KEY)], stream_idle_timeout_s=30)
    return create_app(gateway_settings, real_runtime_factory(engine_settings))


@pytest.fixture(scope="module")
def api_schema() -> Any:
    return schemathesis.openapi.from_asgi("/openapi.json", _app())


schema = schemathesis.pytest.from_fixture("api_schema")


def _clamp(body: Any) -> None:
    if isinstance(body, dict):
        for key in ("max_tokens", "max_completion_tokens"):
            if isinstance(body.get(key), int) and body[key] > 8:
                body[key] = 8
        if "max_tokens" not in body and "max_completion_tokens" not in body:
            body["max_tokens"] = 8
        body.pop("n", None)


@schema.parametrize()
@settings(
    max_examples=max(CASES.values()),
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_conforms_to_its_schema(case: Any) -> None:
    key = f"{case.method.upper()} {case.path}"
    _seen[key] = _seen.get(key, 0) + 1
    if _seen[key] > CASES.get(key, OTHER):
        return
    _clamp(case.body)
    case.call_and_validate(headers={"authorization": f"Bearer {USER_KEY}"})


_seen: dict[str, int] = {}


def test_the_run_made_at_least_500_cases() -> None:
    """Runs after the schema test in file order: the cases were really generated and sent."""
    made = sum(min(n, CASES.get(k, OTHER)) for k, n in _seen.items())
    assert made >= 500, _seen
