"""Per-key limits across replicas on the real gateway: two `spec-gateway serve` processes,
each on its own embedded engine, on one real `redis-server`, through the official `openai`
client.

One pair of processes serves three scenarios, each on its own keys so that none sees
another's budget, in this order (the last one kills Redis):

1. tokens per minute: key A is served until its token budget is spent, then refused with
   429 `rate_limit_exceeded` (type `tokens`); key B, with the same limit, is not affected;
2. the two replicas enforce one cluster-wide requests-per-minute limit, not one each;
3. Redis killed: no request fails for it, each replica enforces its share
   (limit // replicas), `/ready` and the metrics say so; Redis back, limits are
   cluster-wide again.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from tests.gateway.conftest import GatewayProcess, start_replicas, stop_gateways, wait_for
from tests.gateway.key_limits import PROMPT, ask, limits_env
from tests.models import model_pair
from tests.redis_fixtures import RedisServer

pytestmark = pytest.mark.engine

TOKENS_A, TOKENS_B = "sk-tokens-a", "sk-tokens-b"
CLUSTER_KEY = "sk-cluster"
OUTAGE_KEY = "sk-outage"
REPLICAS = 2
#: Completion tokens of every request of the tokens scenario (ignore_eos: exactly these).
MAX_TOKENS = 16
#: What admission reserves: the prompt's estimate (4 characters a token) + max_tokens.
RESERVE = max(1, len(PROMPT) // 4) + MAX_TOKENS
CLUSTER_RPM = 4
OUTAGE_RPM = 6


@functools.cache
def prompt_tokens() -> int:
    """`PROMPT`'s tokens once the model's chat template has wrapped it, as vLLM counts them."""
    tokenizer = AutoTokenizer.from_pretrained(model_pair().target)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, return_dict=False
    )
    return len(ids)


def cost() -> int:
    """What one request of the tokens scenario uses, and is settled at: prompt + completion."""
    return prompt_tokens() + MAX_TOKENS


def tokens_per_minute() -> int:
    """A budget that admits exactly 3 requests. A request is admitted while what the ones
    before it used, plus its own reservation, fits: the n-th needs (n - 1) * cost + RESERVE.
    The 3rd fits with 2 tokens to spare; the 4th would need `cost` more (the budget refills
    at tokens_per_minute / 60 a second: tens of seconds away)."""
    return 2 * cost() + RESERVE + 2


@pytest.fixture(scope="module")
def pair(
    module_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[GatewayProcess]]:
    keys = {"tokens-a": TOKENS_A, "tokens-b": TOKENS_B, "cluster": CLUSTER_KEY}
    keys["outage"] = OUTAGE_KEY
    tpm = {"tokens_per_minute": tokens_per_minute()}
    tenants = {
        "overrides": {
            "tokens-a": tpm,
            "tokens-b": tpm,
            "cluster": {"requests_per_minute": CLUSTER_RPM},
            "outage": {"requests_per_minute": OUTAGE_RPM},
        },
        "replicas": REPLICAS,
        # A loaded test machine can hold a reply past the production 50 ms; a slow
        # answer would put a replica on its local share and blur the counts.
        "redis_timeout_s": 2.0,
    }
    env = limits_env(keys, tenants, module_redis.url)
    gateways = start_replicas(tmp_path_factory.mktemp("key-limits"), env, REPLICAS)
    yield gateways
    stop_gateways(gateways)


def test_tokens_per_minute_spent_then_429_and_key_b_unaffected(
    pair: list[GatewayProcess],
) -> None:
    gw, tpm = pair[0], tokens_per_minute()
    served = []
    for _ in range(5):
        try:
            raw = ask(gw, TOKENS_A, MAX_TOKENS, ignore_eos=True)
        except openai.RateLimitError as exc:
            error = exc
            break
        usage = raw.parse().usage
        assert usage is not None
        assert usage.prompt_tokens + usage.completion_tokens == cost()
        served.append(raw.headers)
    else:
        pytest.fail("key A was never refused")
    expected = 1 + (tpm - RESERVE) // cost()
    print(f"tokens: tpm {tpm}, reserve {RESERVE}, cost {cost()}: {len(served)} served")
    assert expected == 3
    assert len(served) == expected
    assert {h["x-ratelimit-limit-tokens"] for h in served} == {str(tpm)}
    remaining = [int(h["x-ratelimit-remaining-tokens"]) for h in served]
    assert remaining[0] == tpm - RESERVE  # a full bucket less the reservation
    # The second request sees the first settled at its usage, above its reservation
    # (less what refilled since: about a token a second).
    assert tpm - cost() - RESERVE <= remaining[1] < tpm - 2 * RESERVE
    assert error.status_code == 429
    assert error.code == "rate_limit_exceeded"
    assert error.type == "tokens"
    headers = error.response.headers
    assert float(headers["retry-after"]) > 0
    assert int(headers["x-ratelimit-remaining-tokens"]) < RESERVE
    assert headers["x-ratelimit-limit-tokens"] == str(tpm)
    assert headers["x-ratelimit-reset-tokens"]
    raw = ask(gw, TOKENS_B, MAX_TOKENS, ignore_eos=True)
    assert raw.http_response.status_code == 200
    assert raw.headers["x-ratelimit-remaining-tokens"] == str(tpm - RESERVE)


def alternate(pair: list[GatewayProcess], key: str, n: int) -> tuple[list[int], list[Any]]:
    """`n` requests of `key`, replica after replica: the successes per replica, and the
    headers of each allowed request. Any refusal but the key's 429 fails the test."""
    served = [0] * len(pair)
    allowed: list[Any] = []
    codes: set[str | None] = set()
    for i in range(n):
        try:
            raw = ask(pair[i % len(pair)], key, max_tokens=1)
        except openai.RateLimitError as exc:
            codes.add(exc.code)
            continue
        served[i % len(pair)] += 1
        allowed.append(raw.headers)
    assert codes <= {"rate_limit_exceeded"}
    return served, allowed


def test_two_replicas_on_one_redis_hold_one_limit(pair: list[GatewayProcess]) -> None:
    served, _ = alternate(pair, CLUSTER_KEY, 2 * CLUSTER_RPM)
    print(f"cluster: {CLUSTER_RPM} a minute, served per replica {served}")
    # Each replica alone would serve CLUSTER_RPM. One request refills every
    # 60 / CLUSTER_RPM = 15 s: at most one more within this test.
    assert CLUSTER_RPM <= sum(served) <= CLUSTER_RPM + 1
    for gw in pair:
        assert ready(gw)["detail"]["ratelimit"] == "cluster"


def ready(gw: GatewayProcess) -> Any:
    with gw.http(None) as http:
        response = http.get("/ready")
    assert response.status_code == 200
    return response.json()


def metric(gw: GatewayProcess, name: str) -> float:
    with gw.http(None) as http:
        text = http.get("/metrics").text
    found = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert found is not None, name
    return float(found.group(1))


def test_redis_killed_no_request_fails_and_each_replica_enforces_its_share(
    pair: list[GatewayProcess], module_redis: RedisServer
) -> None:
    module_redis.kill()
    share = OUTAGE_RPM // REPLICAS
    served, allowed = alternate(pair, OUTAGE_KEY, 2 * OUTAGE_RPM)
    print(f"outage: {OUTAGE_RPM} a minute over {REPLICAS}, served per replica {served}")
    assert served == [share] * REPLICAS
    assert {h["x-ratelimit-limit-requests"] for h in allowed} == {str(share)}
    for gw in pair:
        state = ready(gw)
        print(f"outage: /ready {state}")
        assert state["ready"] is True
        assert state["detail"]["ratelimit"].startswith("local-share")
        assert metric(gw, 'specgw_ratelimit_mode{mode="local-share"}') == 1.0
        assert metric(gw, "specgw_ratelimit_fallbacks_total") >= 1
        wait_for(lambda gw=gw: ready(gw)["detail"].get("redis") == "degraded", 10)
    module_redis.start()
    for gw in pair:
        took = wait_for(lambda gw=gw: ready(gw)["detail"]["ratelimit"] == "cluster", 15)
        print(f"outage: cluster-wide again {took:.1f} s after Redis came back")
        # Redis decides again: the cluster's limit, not the share, and Redis never saw
        # the key (its outage requests were this replica's alone).
        headers = ask(gw, OUTAGE_KEY, max_tokens=1).headers
        assert headers["x-ratelimit-limit-requests"] == str(OUTAGE_RPM)
    assert metric(pair[0], 'specgw_ratelimit_mode{mode="cluster"}') == 1.0
