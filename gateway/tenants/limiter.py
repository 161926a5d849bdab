"""Per-key requests, tokens and concurrency limits, cluster-wide through Redis.

On the request path a check is one `EVALSHA` of `scripts.CHECK` (GCRA for the
requests and the tokens bucket of the key and its in-flight set, atomically),
bounded by `redis_timeout_s`. Tokens are reserved at admission (prompt estimate +
max_tokens) and settled at the end from usage, off the request path (one
`scripts.SETTLE` call in a background task).

When Redis is slow or down the call times out, the check is decided by this
replica's `LocalShare` (limit // replicas), the limiter turns `local-share` (in
`/ready`'s detail and the metrics) and a background probe pings Redis with
backoff until it answers; a request is never refused because Redis is away.
Settlements that could not reach Redis are kept (bounded) and replayed on
recovery; an in-flight entry that never gets its settlement expires with its
lease (`concurrency_lease_s`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.state.backoff import Backoff, stop_task
from gateway.state.connection import RedisConnection
from gateway.tenants import scripts
from gateway.tenants.decision import Decision, Status
from gateway.tenants.directory import Tenant
from gateway.tenants.gcra import PERIOD_MS, Verdict
from gateway.tenants.local import LocalShare, monotonic_ms
from gateway.tenants.settings import TenantSettings

log = logging.getLogger(__name__)

Mode = Literal["off", "cluster", "local-share", "local"]
MODES: tuple[Mode, ...] = ("off", "cluster", "local-share", "local")
REDIS_DOWN = (RedisError, OSError, asyncio.TimeoutError)
_STATUSES: tuple[Status, ...] = ("allowed", "requests", "tokens", "concurrency")
#: Settlements kept while Redis is away; older ones are dropped (their leases expire).
MAX_PENDING_SETTLEMENTS = 10_000


class LimitEvents(Protocol):
    """What the metrics hear from the limiter (labels are config labels, bounded)."""

    def limit_checked(self, label: str, status: Status) -> None: ...

    def tokens_settled(self, label: str, tokens: int) -> None: ...

    def limit_fallback(self) -> None: ...


@dataclass(slots=True)
class Grant:
    """An admitted request's hold on its key's limits, until `KeyLimiter.settle`."""

    tenant: Tenant
    reserved: int
    headers: dict[str, str] = field(default_factory=dict)
    member: str = ""
    #: Redis decided (the settlement goes there too); else this replica's share did.
    cluster: bool = False
    settled: bool = False


class KeyLimiter:
    def __init__(
        self,
        settings: TenantSettings,
        redis: Redis | None = None,
        *,
        key_prefix: str = "specgw:{default}",
        events: LimitEvents | None = None,
        local: LocalShare | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self._s = settings
        self._redis = redis
        self._prefix = f"{key_prefix}:rl"
        self._events = events
        self.local = local or LocalShare(settings.replicas, monotonic_ms)
        self._backoff = backoff or Backoff(0.25, 5.0)
        policies = [settings.default, *(settings.policy_of(label) for label in settings.keys)]
        self._any_limit = any(p.limited for p in policies)
        self._healthy = redis is not None
        self._check_script = redis.register_script(scripts.CHECK) if redis else None
        self._settle_script = redis.register_script(scripts.SETTLE) if redis else None
        self._pending: deque[tuple[Tenant, int, str]] = deque(maxlen=MAX_PENDING_SETTLEMENTS)
        self._tasks: set[asyncio.Task[None]] = set()
        self._probe: asyncio.Task[None] | None = None
        self.fallbacks = 0

    @classmethod
    def connect(
        cls,
        settings: TenantSettings,
        connection: RedisConnection | None,
        *,
        key_prefix: str,
        events: LimitEvents | None = None,
    ) -> KeyLimiter:
        """A limiter with its own client, every call bounded by `redis_timeout_s` and
        every new connection by `redis_connect_timeout_s` (None: no Redis, each replica
        enforces limit // replicas)."""
        redis = None
        if connection is not None:
            redis = connection.client(
                op_timeout_s=settings.redis_timeout_s,
                connect_timeout_s=settings.redis_connect_timeout_s,
            )
        return cls(settings, redis, key_prefix=key_prefix, events=events)

    @property
    def mode(self) -> Mode:
        if not self._any_limit:
            return "off"
        if self._redis is None:
            return "local"
        return "cluster" if self._healthy else "local-share"

    def describe(self) -> str:
        """`/ready`'s detail: where limits are decided now."""
        if self.mode == "local-share":
            return f"local-share (redis unreachable: limit // {self.local.replicas} here)"
        return self.mode

    # ---- lifecycle --------------------------------------------------------------------
    async def start(self) -> None:
        """Load the scripts (bounded); an unreachable Redis starts the probe. Nothing to
        do where no key has a limit."""
        if self._redis is None or not self._any_limit:
            return
        try:
            await self._redis.script_load(scripts.CHECK)
            await self._redis.script_load(scripts.SETTLE)
        except REDIS_DOWN as exc:
            log.warning("rate limits: Redis unreachable at start (%s); local shares apply", exc)
            self._degrade()

    async def close(self) -> None:
        if self._probe is not None:
            await stop_task(self._probe, 1.0)
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=1.0)
        for task in self._tasks:
            task.cancel()
        if self._redis is not None:
            await self._redis.aclose()

    async def settled(self) -> None:
        """Wait for the settlements already handed to Redis (tests, shutdown)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks))

    # ---- request path -----------------------------------------------------------------
    async def admit(self, tenant: Tenant, tokens: int) -> Grant:
        """Take one request and `tokens` reserved tokens from the key's limits, or raise
        its 429 (`rate_limit_exceeded`, with retry-after and the x-ratelimit headers)."""
        if not tenant.policy.limited:
            return Grant(tenant, tokens)
        member = uuid.uuid4().hex
        decision = await self._check_cluster(tenant, tokens, member) if self._healthy else None
        cluster = decision is not None
        if decision is None:
            decision = self.local.check(tenant, tokens)
        elif decision.allowed:
            self.local.shadow(tenant, tokens)
        if self._events is not None:
            self._events.limit_checked(tenant.label, decision.status)
        if not decision.allowed:
            raise decision.refusal(tokens)
        return Grant(tenant, tokens, decision.headers(), member, cluster)

    def settle(self, grant: Grant, used_tokens: int | None) -> None:
        """The request ended having used `used_tokens` (None: unknown, keep the
        reservation). Never waits for Redis: the cluster's share goes in a task."""
        if grant.settled or not grant.tenant.policy.limited:
            return
        grant.settled = True
        delta = 0 if used_tokens is None else used_tokens - grant.reserved
        self.local.settle(grant.tenant, delta)
        if self._events is not None:
            self._events.tokens_settled(grant.tenant.label, grant.reserved + delta)
        policy = grant.tenant.policy
        needed = policy.max_concurrent > 0 or (policy.tokens_per_minute > 0 and delta != 0)
        if grant.cluster and needed:
            task = asyncio.get_running_loop().create_task(
                self._settle_cluster(grant.tenant, delta, grant.member)
            )
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    # ---- Redis ------------------------------------------------------------------------
    def _keys(self, tenant: Tenant) -> list[str]:
        base = f"{self._prefix}:{tenant.key}"
        return [f"{base}:requests", f"{base}:tokens", f"{base}:inflight"]

    async def _check_cluster(self, tenant: Tenant, tokens: int, member: str) -> Decision | None:
        assert self._check_script is not None
        p = tenant.policy
        lease_ms = self._s.concurrency_lease_s * 1000
        args: list[str | float] = ["", PERIOD_MS, p.requests_per_minute, p.tokens_per_minute]
        args += [p.max_concurrent, tokens, member, lease_ms]
        try:
            reply = await self._check_script(keys=self._keys(tenant), args=args)
        except REDIS_DOWN as exc:
            log.warning("rate limits: Redis check failed (%r); local shares apply", exc)
            self._degrade()
            return None
        return decision_from_reply(reply, tenant)

    async def _settle_cluster(self, tenant: Tenant, delta: int, member: str) -> None:
        if not self._healthy:
            self._pending.append((tenant, delta, member))
            return
        try:
            await self._run_settle(tenant, delta, member)
        except REDIS_DOWN:
            self._pending.append((tenant, delta, member))
            self._degrade()

    async def _run_settle(self, tenant: Tenant, delta: int, member: str) -> None:
        assert self._settle_script is not None
        keys = self._keys(tenant)
        tpm = tenant.policy.tokens_per_minute
        await self._settle_script(keys=[keys[1], keys[2]], args=["", PERIOD_MS, tpm, delta, member])

    def _degrade(self) -> None:
        self.fallbacks += 1
        if self._events is not None:
            self._events.limit_fallback()
        self._healthy = False
        if self._probe is None or self._probe.done():
            # In a context of its own: the probe outlives the request that found Redis
            # gone, and must neither log under its request id nor join its trace.
            self._probe = asyncio.get_running_loop().create_task(
                self._reconnect(), context=contextvars.Context()
            )

    async def _reconnect(self) -> None:
        """Ping with backoff until Redis answers, replay kept settlements, then go back."""
        assert self._redis is not None
        while True:
            await asyncio.sleep(self._backoff.next_delay())
            try:
                await self._redis.ping()
                while self._pending:
                    tenant, delta, member = self._pending[0]
                    await self._run_settle(tenant, delta, member)
                    self._pending.popleft()
            except REDIS_DOWN:
                continue
            self._backoff.reset()
            self._healthy = True
            log.info("rate limits: Redis is back; limits are cluster-wide again")
            return


def decision_from_reply(reply: Any, tenant: Tenant) -> Decision:
    """The `scripts.CHECK` reply as a `Decision` (limits are the cluster's, not shares)."""
    code, r_left, r_reset, t_left, t_reset, retry, _ = (int(v) for v in reply)
    status = _STATUSES[code]
    retry_ms = math.inf if retry < 0 else float(retry)
    p = tenant.policy

    def verdict(limit: int, left: int, reset: int, refused: bool) -> Verdict | None:
        if limit <= 0:
            return None
        return Verdict(not refused, limit, left, float(reset), retry_ms if refused else 0.0, 0.0)

    return Decision(
        status,
        verdict(p.requests_per_minute, r_left, r_reset, status == "requests"),
        verdict(p.tokens_per_minute, t_left, t_reset, status == "tokens"),
        p.max_concurrent,
        retry_ms,
    )
