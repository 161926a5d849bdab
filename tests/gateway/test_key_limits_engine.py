"""Per-key limits on the real gateway (a `spec-gateway serve` process on the embedded
model), through the official `openai` client: key A gets exactly N requests a minute, then
429 with `retry-after` and OpenAI's rate-limit headers; key B is not affected."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from gateway.auth import digest
from tests.gateway.conftest import ADMIN_KEY, GatewayProcess, start_gateway, stop_gateway

pytestmark = pytest.mark.engine

KEY_A, KEY_B = "sk-team-a", "sk-team-b"
LIMIT = 3


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    tenants = {
        "keys": {"team-a": digest(KEY_A), "team-b": digest(KEY_B)},
        "default": {"requests_per_minute": LIMIT},
    }
    env = {
        "SPECGW_API_KEYS": f"{digest(KEY_A)},{digest(KEY_B)}",
        "SPECGW_ADMIN_KEYS": digest(ADMIN_KEY),
        "SPECGW_TENANTS": json.dumps(tenants),
    }
    gw = start_gateway(Path(tmp_path_factory.mktemp("limits")), extra_env=env)
    yield gw
    stop_gateway(gw)


def _ask(gw: GatewayProcess, key: str) -> openai.APIResponse[object]:
    client = gw.client(key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="specgw-default",
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=2,
        temperature=0,
    )
    return raw  # type: ignore[return-value]


def test_key_a_gets_exactly_its_limit_and_key_b_is_unaffected(limited: GatewayProcess) -> None:
    remaining = []
    for _ in range(LIMIT):
        raw = _ask(limited, KEY_A)
        assert raw.headers["x-ratelimit-limit-requests"] == str(LIMIT)
        remaining.append(int(raw.headers["x-ratelimit-remaining-requests"]))
    assert remaining == sorted(remaining, reverse=True)
    with pytest.raises(openai.RateLimitError) as refused:
        _ask(limited, KEY_A)
    response = refused.value.response
    assert response.status_code == 429
    assert float(response.headers["retry-after"]) > 0
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    raw = _ask(limited, KEY_B)
    assert raw.http_response.status_code == 200
    assert raw.headers["x-ratelimit-remaining-requests"] == str(LIMIT - 1)
