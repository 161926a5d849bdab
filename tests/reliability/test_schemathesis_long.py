"""The long schemathesis run (at least 5,000 generated cases), over a socket.

Same checks as `tests/gateway/test_schemathesis.py`, on the reliability tests'
shared gateway (one real vLLM engine, every response checked: no 5xx, status codes and bodies as
documented), with 5,000 cases sent to the two completion routes alone, two
thirds to chat completions, each route's share split 60/40 between schema-valid
and schema-violating cases (see the short test for why the modes are budgeted
apart and what a valid case may get); the other operations get up to 25 cases
per mode on top (schemathesis makes only a few for most of them).
`SPECGW_SCHEMATHESIS_CASES` scales the 5,000. Measured: about 8 minutes here.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from tests.gateway.conftest import GatewayProcess
from tests.gateway.test_schemathesis import budget_key, coerced, load_schema, validate

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("SPECGW_LONG_TESTS") != "1",
        reason="the 5,000-case run takes about 8 minutes on 2 cores: `make test-long`",
    ),
]

TOTAL = int(os.environ.get("SPECGW_SCHEMATHESIS_CASES", "5000"))
_CHAT = TOTAL * 2 // 3
_ROUTES = {"POST /v1/chat/completions": _CHAT, "POST /v1/completions": TOTAL - _CHAT}
BUDGET = {
    f"{route} {mode}": share * 6 // 10 if mode == "positive" else share - share * 6 // 10
    for route, share in _ROUTES.items()
    for mode in ("positive", "negative")
}
OTHER = 25  # per operation and mode
_seen: dict[str, int] = {}


@pytest.fixture(scope="module")
def long_schema(shared_gateway: GatewayProcess) -> Any:
    return load_schema(shared_gateway.base_url)


schema = schemathesis.pytest.from_fixture("long_schema").exclude(path="/v1/responses")


@schema.parametrize()
@settings(
    max_examples=max(_ROUTES.values()),  # both modes come out of one run
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_api_conforms_to_its_schema_long(case: Any) -> None:
    key = budget_key(case)
    _seen[key] = _seen.get(key, 0) + 1
    if _seen[key] > BUDGET.get(key, OTHER):
        return
    validate(case)


def test_the_long_run_made_enough_cases() -> None:
    """Runs after the schema test in file order: the budget was really spent."""
    made = sum(min(n, BUDGET.get(k, OTHER)) for k, n in _seen.items())
    routes = sum(min(_seen.get(k, 0), n) for k, n in BUDGET.items())
    print(
        f"\n{made} cases sent, {routes} of them to the completion routes; "
        f"{len(coerced)} served after a lax type coercion"
    )
    assert routes >= TOTAL, _seen
    for key, wanted in BUDGET.items():
        assert _seen.get(key, 0) >= wanted, (key, _seen)
