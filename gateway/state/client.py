"""Build a redis-py asyncio client whose every call is bounded in time.

redis-py's own retry is switched off: the callers below retry on their own
schedule (with backoff) and must never stall a loop for retries x timeout.
Credentials and TLS come with a `RedisConnection` (see `connection.py`); a
bare URL (credentials in it, if any) is the same as a connection without them.
"""

from __future__ import annotations

from redis.asyncio import Redis

from gateway.state.connection import RedisConnection


def bounded_redis(
    url: str | RedisConnection, *, op_timeout_s: float, connect_timeout_s: float
) -> Redis:
    """A client with socket and connect timeouts and no hidden retries."""
    connection = url if isinstance(url, RedisConnection) else RedisConnection(url)
    return connection.client(op_timeout_s=op_timeout_s, connect_timeout_s=connect_timeout_s)
