"""Build a redis-py asyncio client whose every call is bounded in time.

redis-py's own retry is switched off: the callers below retry on their own
schedule (with backoff) and must never stall a loop for retries x timeout.
"""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff


def bounded_redis(url: str, *, op_timeout_s: float, connect_timeout_s: float) -> Redis:
    """A client with socket and connect timeouts and no hidden retries."""
    return Redis.from_url(
        url,
        socket_timeout=op_timeout_s,
        socket_connect_timeout=connect_timeout_s,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
        health_check_interval=30,
    )
