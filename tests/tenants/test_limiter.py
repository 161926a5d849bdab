"""Per-key limits across replicas on a real redis-server, and the local share without it."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from gateway.errors import ErrorKind, GatewayError
from gateway.observability.logs import RequestContextFilter, request_context
from gateway.tenants import KeyLimiter, KeyPolicy, Tenant, TenantDirectory
from tests.clock import until
from tests.redis_fixtures import DelayProxy, RedisServer
from tests.tenants.limits import KEY_A, KEY_B, directory, limiter, tenant
from tests.timing import collector_paused


async def admit_many(limiters: list[KeyLimiter], who: Tenant, n: int, tokens: int = 1) -> int:
    """`n` checks spread over the replicas in turn; how many were allowed."""
    allowed = 0
    for i in range(n):
        try:
            await limiters[i % len(limiters)].admit(who, tokens)
        except GatewayError as exc:
            if exc.status != 429:
                raise
        else:
            allowed += 1
    return allowed


@asynccontextmanager
async def running(
    tenants: TenantDirectory, url: str | None, n: int = 1, timeout_s: float = 0.5
) -> AsyncIterator[list[KeyLimiter]]:
    """`n` started limiters on `url`, as `n` replicas; closed at the end."""
    replicas = [limiter(tenants, url, timeout_s) for _ in range(n)]
    try:
        for one in replicas:
            await one.start()
        yield replicas
    finally:
        for one in replicas:
            await one.close()


async def test_two_replicas_on_one_redis_enforce_one_cluster_wide_limit(
    redis_server: RedisServer,
) -> None:
    tenants = directory(KeyPolicy(requests_per_minute=10), replicas=2)
    a, b = tenant(tenants, KEY_A), tenant(tenants, KEY_B)
    async with running(tenants, redis_server.url, 2) as replicas:
        # 10 per minute refill one every 6 s: a test this short sees at most one more.
        assert 10 <= await admit_many(replicas, a, 30) <= 11
        assert 10 <= await admit_many(replicas, b, 30) <= 11  # B has its own budget
        assert [one.mode for one in replicas] == ["cluster", "cluster"]
        with pytest.raises(GatewayError) as caught:
            await replicas[1].admit(a, 1)
        error = caught.value
        assert error.kind is ErrorKind.RATE_LIMITED_REQUESTS
        headers = error.response_headers()
        assert headers["x-ratelimit-limit-requests"] == "10"  # the cluster's limit
        assert headers["x-ratelimit-remaining-requests"] == "0"
        assert 1 <= int(headers["retry-after"]) <= 6


async def test_redis_stopped_each_replica_enforces_its_share_and_serves(
    redis_server: RedisServer,
) -> None:
    tenants = directory(KeyPolicy(requests_per_minute=10), replicas=2)
    a = tenant(tenants, KEY_A)
    async with running(tenants, redis_server.url, 2) as replicas:
        redis_server.stop()
        # Never an error because Redis is away: every refusal is a key's own 429.
        allowed = await admit_many(replicas, a, 30)
        assert allowed == 10  # 10 // 2 = 5 on each replica
        assert [one.mode for one in replicas] == ["local-share", "local-share"]
        assert "redis unreachable" in replicas[0].describe()
        grant_headers = (await replicas[0].admit(tenant(tenants, KEY_B), 1)).headers
        assert grant_headers["x-ratelimit-limit-requests"] == "5"  # what is enforced now
        redis_server.start()
        await until_mode(replicas, "cluster")


async def test_a_share_already_spent_through_redis_still_counts_after_it_goes(
    redis_server: RedisServer,
) -> None:
    """Shadow accounting: a replica that used its share before Redis went away does not
    get a fresh one at failover."""
    tenants = directory(KeyPolicy(requests_per_minute=10), replicas=2)
    a = tenant(tenants, KEY_A)
    async with running(tenants, redis_server.url) as (one,):
        assert await admit_many([one], a, 6) == 6  # through Redis, more than a share of 5
        redis_server.stop()
        assert await admit_many([one], a, 5) == 0


async def test_slow_redis_is_bounded_and_falls_back(
    redis_server: RedisServer, delay_proxy: DelayProxy
) -> None:
    """The request that finds Redis slow waits one operation timeout (0.1 s), far less
    than Redis takes (2 s each way through the proxy); the next waits for none."""
    tenants = directory(KeyPolicy(requests_per_minute=100))
    async with running(tenants, delay_proxy.url, timeout_s=0.1) as (one,):
        delay_proxy.delay_s = 2.0
        with collector_paused():
            started = time.monotonic()
            grant = await one.admit(tenant(tenants, KEY_A), 1)
            assert time.monotonic() - started < 1.0
        assert not grant.cluster
        assert one.mode == "local-share"
        with collector_paused():
            started = time.monotonic()
            await one.admit(tenant(tenants, KEY_A), 1)  # no second wait on a known-slow Redis
            assert time.monotonic() - started < 0.1  # a wait would take the timeout
        delay_proxy.delay_s = 0.0
        await until_mode([one], "cluster")


async def test_the_probe_is_no_part_of_the_request_that_found_redis_gone(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    """The probe outlives that request: its lines must not carry the request's id."""
    caplog.handler.addFilter(RequestContextFilter())
    caplog.set_level(logging.INFO, logger="gateway.tenants.limiter")
    tenants = directory(KeyPolicy(requests_per_minute=10))
    async with running(tenants, redis_server.url) as (one,):
        redis_server.stop()
        with request_context("req-1"):
            await one.admit(tenant(tenants, KEY_A), 1)
        redis_server.start()
        await until_mode([one], "cluster")
    failed, back = (
        next(r for r in caplog.records if text in r.getMessage())
        for text in ("check failed", "Redis is back")
    )
    assert getattr(failed, "request_id", None) == "req-1"  # the request's own line
    assert not hasattr(back, "request_id")


async def test_tokens_reserved_then_settled_from_usage(redis_server: RedisServer) -> None:
    tenants = directory(KeyPolicy(tokens_per_minute=1000))
    a = tenant(tenants, KEY_A)
    async with running(tenants, redis_server.url) as (one,):
        grant = await one.admit(a, 600)
        assert grant.headers["x-ratelimit-remaining-tokens"] == "400"
        with pytest.raises(GatewayError) as caught:
            await one.admit(a, 600)
        assert caught.value.kind is ErrorKind.RATE_LIMITED_TOKENS
        one.settle(grant, 100)  # used 100 of 600: 500 come back
        await one.settled()
        second = await one.admit(a, 800)
        assert int(second.headers["x-ratelimit-remaining-tokens"]) in (99, 100)
        one.settle(second, 900)  # used more than reserved: the debt is charged
        await one.settled()
        with pytest.raises(GatewayError):
            await one.admit(a, 50)


async def test_concurrency_is_cluster_wide_and_freed_at_settlement(
    redis_server: RedisServer,
) -> None:
    tenants = directory(KeyPolicy(max_concurrent=2), replicas=2)
    a = tenant(tenants, KEY_A)
    async with running(tenants, redis_server.url, 2) as replicas:
        first = await replicas[0].admit(a, 1)
        await replicas[1].admit(a, 1)
        with pytest.raises(GatewayError) as caught:
            await replicas[1].admit(a, 1)
        assert "concurrent" in caught.value.message
        replicas[0].settle(first, 1)
        await replicas[0].settled()
        await replicas[1].admit(a, 1)


async def test_settlements_made_while_redis_is_away_are_replayed(
    redis_server: RedisServer,
) -> None:
    tenants = directory(KeyPolicy(max_concurrent=1))
    a = tenant(tenants, KEY_A)
    async with running(tenants, redis_server.url) as (one,):
        grant = await one.admit(a, 1)
        redis_server.stop()
        one.settle(grant, 1)  # the in-flight entry cannot be removed now
        await one.settled()
        redis_server.start()
        await until_mode([one], "cluster")
        await one.admit(a, 1)  # the replayed settlement freed the slot


async def test_without_redis_the_whole_limit_is_local() -> None:
    tenants = directory(KeyPolicy(requests_per_minute=3))
    one = limiter(tenants, None)
    assert one.mode == "local"
    assert await admit_many([one], tenant(tenants, KEY_A), 10) == 3


async def test_keys_without_limits_take_no_round_trip(redis_server: RedisServer) -> None:
    tenants = directory(KeyPolicy())
    async with running(tenants, redis_server.url) as (one,):
        assert one.mode == "off"
        before = redis_server.command_calls().get("evalsha", 0)
        grant = await one.admit(tenant(tenants, KEY_A), 10)
        assert grant.headers == {}
        assert redis_server.command_calls().get("evalsha", 0) == before


async def test_one_round_trip_per_check(redis_server: RedisServer) -> None:
    """A check is one EVALSHA; with no token or concurrency limit nothing else follows."""
    tenants = directory(KeyPolicy(requests_per_minute=100))
    a = tenant(tenants, KEY_A)
    async with running(tenants, redis_server.url) as (one,):
        await one.admit(a, 1)  # the pool's connection is open from here on
        before = redis_server.command_calls()
        for _ in range(5):
            one.settle(await one.admit(a, 1), 1)
        await one.settled()
        after = redis_server.command_calls()
    calls = {name: after[name] - before.get(name, 0) for name in after}
    calls = {name: n for name, n in calls.items() if n}
    assert calls.pop("evalsha") == 5
    # What remains ran inside the script (commandstats counts those too), or is the
    # stats client's own connection (hello, info).
    assert set(calls) <= {"time", "get", "set", "hello", "info"}, calls


async def until_mode(limiters: list[KeyLimiter], mode: str) -> None:
    """Polled: the limiter has no event for its mode (the probe runs on its own schedule)."""
    await until(lambda: all(one.mode == mode for one in limiters), 5.0, f"mode {mode}")
