"""Per-key limits on the real gateway (a `spec-gateway serve` process on the embedded
model), through the official `openai` client: key A gets exactly N requests a minute, then
429 with `retry-after` and OpenAI's rate-limit headers; key B is not affected."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.gateway.conftest import GatewayProcess, start_gateway, stop_gateway
from tests.gateway.key_limits import ask, limits_env

pytestmark = pytest.mark.engine

KEY_A, KEY_B = "sk-team-a", "sk-team-b"
LIMIT = 3


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    keys = {"team-a": KEY_A, "team-b": KEY_B}
    env = limits_env(keys, {"default": {"requests_per_minute": LIMIT}})
    gw = start_gateway(Path(tmp_path_factory.mktemp("limits")), extra_env=env)
    yield gw
    stop_gateway(gw)


def test_key_a_gets_exactly_its_limit_and_key_b_is_unaffected(limited: GatewayProcess) -> None:
    remaining = []
    for _ in range(LIMIT):
        raw = ask(limited, KEY_A)
        assert raw.headers["x-ratelimit-limit-requests"] == str(LIMIT)
        remaining.append(int(raw.headers["x-ratelimit-remaining-requests"]))
    assert remaining == sorted(remaining, reverse=True)
    with pytest.raises(openai.RateLimitError) as refused:
        ask(limited, KEY_A)
    response = refused.value.response
    assert response.status_code == 429
    assert float(response.headers["retry-after"]) > 0
    assert response.headers["x-ratelimit-remaining-requests"] == "0"
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    raw = ask(limited, KEY_B)
    assert raw.http_response.status_code == 200
    assert raw.headers["x-ratelimit-remaining-requests"] == str(LIMIT - 1)
