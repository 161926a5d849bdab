"""Shared helpers: keys, a directory, and limiters on a real Redis."""

from __future__ import annotations

from openai.types.chat import ChatCompletionMessageParam

from gateway.auth import digest
from gateway.state.backoff import Backoff
from gateway.state.connection import RedisConnection
from gateway.tenants import KeyLimiter, KeyPolicy, Tenant, TenantDirectory, TenantSettings

KEY_A = "sk-tenant-a"
KEY_B = "sk-tenant-b"
MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are a helpful Python assistant."},
    {"role": "user", "content": "What does the json module do?"},
]


def directory(policy: KeyPolicy, replicas: int = 1, **overrides: KeyPolicy) -> TenantDirectory:
    settings = TenantSettings(
        keys={"team-a": digest(KEY_A), "team-b": digest(KEY_B)},
        default=policy,
        overrides=overrides,
        replicas=replicas,
    )
    return TenantDirectory(settings, [digest(KEY_A), digest(KEY_B)])


def tenant(tenants: TenantDirectory, key: str) -> Tenant:
    return tenants.identify(f"Bearer {key}")


def limiter(tenants: TenantDirectory, url: str | None, timeout_s: float = 0.5) -> KeyLimiter:
    """A limiter on `url` (None: no Redis) that probes a lost Redis every few ms."""
    redis = None
    if url is not None:
        connection = RedisConnection(url)
        redis = connection.client(op_timeout_s=timeout_s, connect_timeout_s=timeout_s)
    return KeyLimiter(tenants.settings, redis, backoff=Backoff(0.01, 0.05))
