"""GCRA (Python and the Redis script agree), Go durations, and the 429's shape."""

from __future__ import annotations

import math

import pytest
import redis

from gateway.errors import ErrorKind
from gateway.tenants import scripts
from gateway.tenants.decision import Decision, go_duration
from gateway.tenants.gcra import PERIOD_MS, charge, check
from tests.redis_fixtures import RedisServer

# (TAT before or None, now, limit per minute, cost) -> (allowed, remaining, reset ms, retry ms)
CHECKS = [
    # Empty bucket of 60/min (I = 1 s): the first request leaves 59, full again in 1 s.
    ((None, 0.0, 60, 1), (True, 59, 1000.0, 0.0)),
    # 59 requests already in this instant: the 60th fits, nothing left, full in 60 s.
    ((59_000.0, 0.0, 60, 1), (True, 0, 60_000.0, 0.0)),
    # 60 in: the 61st waits one interval.
    ((60_000.0, 0.0, 60, 1), (False, 0, 60_000.0, 1000.0)),
    # ... and 1 s later it fits again.
    ((60_000.0, 1000.0, 60, 1), (True, 0, 60_000.0, 0.0)),
    # A TAT in the past is a full bucket.
    ((5_000.0, 90_000.0, 60, 1), (True, 59, 1000.0, 0.0)),
    # Tokens: 1000/min (I = 60 ms); 600 reserved of a fresh bucket.
    ((None, 0.0, 1000, 600), (True, 400, 36_000.0, 0.0)),
    # 600 more with 400 left: refused until 200 have refilled (12 s).
    ((36_000.0, 0.0, 1000, 600), (False, 400, 36_000.0, 12_000.0)),
    # More than the whole minute's tokens can never fit.
    ((None, 0.0, 1000, 1001), (False, 1000, 0.0, math.inf)),
]


@pytest.mark.parametrize(("args", "expected"), CHECKS)
def test_check_table(
    args: tuple[float | None, float, int, int], expected: tuple[bool, int, float, float]
) -> None:
    verdict = check(*args)
    assert (verdict.allowed, verdict.remaining, verdict.reset_ms) == expected[:3]
    assert verdict.retry_ms == pytest.approx(expected[3])


def test_a_minute_of_requests_then_one_per_interval() -> None:
    tat, allowed, now = None, 0, 0.0
    for _ in range(100):  # 100 at once against 10/min: exactly 10 pass
        verdict = check(tat, now, 10, 1)
        if verdict.allowed:
            tat, allowed = verdict.tat_ms, allowed + 1
    assert allowed == 10
    assert not check(tat, 5_999.0, 10, 1).allowed
    assert check(tat, 6_000.0, 10, 1).allowed


def test_charge_keeps_debt_to_one_period_and_refunds_to_full() -> None:
    assert charge(None, 0.0, 60, 1000) == PERIOD_MS  # 1000 s of debt capped to 60 s
    assert charge(30_000.0, 0.0, 60, -10) == 20_000.0
    assert charge(5_000.0, 0.0, 60, -10) is None  # refunded past full: nothing stored


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "0s"),
        (0.3, "1ms"),
        (20, "20ms"),
        (999, "999ms"),
        (1000, "1s"),
        (1500, "1.5s"),
        (17_329, "17.329s"),
        (60_000, "1m0s"),
        (360_000, "6m0s"),
        (90_500, "1m30.5s"),
        (3_600_000, "1h0m0s"),
    ],
)
def test_go_duration_as_openai_writes_resets(ms: float, text: str) -> None:
    assert go_duration(ms) == text


def test_refusal_is_openais_rate_limit_error() -> None:
    verdict = check(60_000.0, 0.0, 60, 1)
    error = Decision("requests", verdict, None, 0, verdict.retry_ms).refusal(1)
    assert error.status == 429
    assert error.kind is ErrorKind.RATE_LIMITED_REQUESTS
    body = error.body()["error"]
    assert isinstance(body, dict)
    assert (body["type"], body["code"]) == ("requests", "rate_limit_exceeded")
    assert "Limit 60, Used 60, Requested 1" in body["message"]
    headers = error.response_headers()
    assert headers["retry-after"] == "1"
    assert headers["retry-after-ms"] == "1000"
    assert headers["x-ratelimit-limit-requests"] == "60"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert headers["x-ratelimit-reset-requests"] == "1m0s"


def test_request_too_large_has_no_retry_after() -> None:
    verdict = check(None, 0.0, 100, 500)
    error = Decision("tokens", None, verdict, 0, verdict.retry_ms).refusal(500)
    assert error.kind is ErrorKind.RATE_LIMITED_TOKENS
    assert "retry-after" not in error.response_headers()
    assert "Request too large" in error.message


def _run_check(
    client: redis.Redis, tat: float | None, now: float, limit: int, cost: int
) -> list[int]:
    client.delete("t:r", "t:t", "t:c")
    if tat is not None:
        client.set("t:t", f"{tat:.3f}")
    return client.eval(  # type: ignore[no-any-return]
        scripts.CHECK, 3, "t:r", "t:t", "t:c", now, PERIOD_MS, 0, limit, 0, cost, "m", 1000
    )


def test_redis_script_runs_the_same_formula(redis_server: RedisServer) -> None:
    """Every row of the table through `scripts.CHECK` (time pinned), as a token bucket."""
    with redis_server.client() as client:
        for (tat, now, limit, cost), (allowed, remaining, reset, retry) in CHECKS:
            reply = _run_check(client, tat, now, limit, cost)
            status, _, _, left, reset_ms, retry_ms, _ = reply
            assert (status == 0) is allowed, (tat, now, limit, cost)
            assert left == remaining
            assert reset_ms == math.ceil(reset)
            assert retry_ms == (-1 if math.isinf(retry) else math.ceil(retry))


def test_redis_script_all_or_nothing(redis_server: RedisServer) -> None:
    """A request refused on tokens takes nothing from the requests bucket."""
    with redis_server.client() as client:
        args = (0.0, PERIOD_MS, 10, 100, 2)
        first = client.eval(scripts.CHECK, 3, "k:r", "k:t", "k:c", *args, 80, "a", 60_000)
        assert first[0] == 0
        refused = client.eval(scripts.CHECK, 3, "k:r", "k:t", "k:c", *args, 80, "b", 60_000)
        assert refused[0] == 2  # tokens
        assert refused[1] == 9  # requests remaining: the refusal took none
        assert client.zcard("k:c") == 1
        third = client.eval(scripts.CHECK, 3, "k:r", "k:t", "k:c", *args, 10, "c", 60_000)
        assert third[0] == 0
        assert third[6] == 2
        fourth = client.eval(scripts.CHECK, 3, "k:r", "k:t", "k:c", *args, 1, "d", 60_000)
        assert fourth[0] == 3  # two in flight of 2
        client.eval(scripts.SETTLE, 2, "k:t", "k:c", 0.0, PERIOD_MS, 100, -90, "a")
        assert client.zcard("k:c") == 1
        fifth = client.eval(scripts.CHECK, 3, "k:r", "k:t", "k:c", *args, 1, "e", 60_000)
        assert fifth[0] == 0
        assert fifth[3] == 100 - (80 + 10 - 90) - 1  # 80 + 10 reserved, 90 refunded, 1 more
