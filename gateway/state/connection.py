"""How every Redis client of the gateway reaches its server: address, ACL user, TLS.

One `RedisConnection` is built from the gateway settings at start and hands out
bounded clients (`client(...)`) to the class store, the flag overrides, the flag
admin and the rate limiter, so authentication and TLS are configured once.

* Authentication: Redis 6 ACLs (`AUTH username password`) or a plain
  `requirepass` (no username). The password comes from `SPECGW_REDIS_PASSWORD`
  (a Secret as an env var) or `SPECGW_REDIS_PASSWORD_FILE` (a mounted Secret),
  so it never has to sit in the URL; redis-py lets credentials in the URL win
  over these (`Redis.from_url` merges the URL's options last).
* TLS: a `rediss://` URL. The CA bundle verifies the server (unset: the system
  store); a client certificate and key answer a server with `tls-auth-clients yes`
  (mutual TLS). TLS file settings with a plain `redis://` URL are refused at start
  rather than silently ignored.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

if TYPE_CHECKING:
    from gateway.settings import GatewaySettings


@dataclass(frozen=True, slots=True)
class RedisConnection:
    """The server, credentials and TLS material; `password` never shows in a repr."""

    url: str
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls_ca_file: Path | None = None
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_check_hostname: bool = True

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"Redis URL scheme must be redis, rediss or unix, not {scheme!r}")
        tls_files = (self.tls_ca_file, self.tls_cert_file, self.tls_key_file)
        if any(f is not None for f in tls_files) and not self.tls:
            raise ValueError("Redis TLS files are set but the URL is not rediss://")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("Redis mutual TLS needs both a client certificate and its key")
        for path in tls_files:
            if path is not None and not path.is_file():
                raise ValueError(f"Redis TLS file {path} does not exist")

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> RedisConnection | None:
        """The connection the settings describe; None without `redis_url`."""
        if not settings.redis_url:
            return None
        password = settings.redis_password.get_secret_value() if settings.redis_password else None
        if settings.redis_password_file is not None:
            if password is not None:
                raise ValueError("set redis_password or redis_password_file, not both")
            # A mounted Secret file usually ends with a newline that is not part of it.
            password = settings.redis_password_file.read_text(encoding="utf-8").rstrip("\r\n")
        return cls(
            url=settings.redis_url,
            username=settings.redis_username,
            password=password,
            tls_ca_file=settings.redis_tls_ca_file,
            tls_cert_file=settings.redis_tls_cert_file,
            tls_key_file=settings.redis_tls_key_file,
            tls_check_hostname=settings.redis_tls_check_hostname,
        )

    def options(self) -> dict[str, Any]:
        """Keyword arguments for `Redis.from_url` (the URL's own options still win)."""
        out: dict[str, Any] = {}
        if self.username is not None:
            out["username"] = self.username
        if self.password is not None:
            out["password"] = self.password
        if self.tls:
            out["ssl_cert_reqs"] = "required"
            out["ssl_check_hostname"] = self.tls_check_hostname
            if self.tls_ca_file is not None:
                out["ssl_ca_certs"] = str(self.tls_ca_file)
            if self.tls_cert_file is not None:
                out["ssl_certfile"] = str(self.tls_cert_file)
                out["ssl_keyfile"] = str(self.tls_key_file)
        return out

    def client(
        self,
        *,
        op_timeout_s: float,
        connect_timeout_s: float,
        retries: int = 0,
        decode_responses: bool = True,
    ) -> Redis:
        """A client whose every call is bounded in time, with `retries` immediate retries.

        redis-py's own retry is off by default: the callers retry on their own
        schedule (with backoff) and must never stall a loop for retries x timeout.
        """
        return Redis.from_url(
            self.url,
            socket_timeout=op_timeout_s,
            socket_connect_timeout=connect_timeout_s,
            retry=Retry(NoBackoff(), retries),
            decode_responses=decode_responses,
            health_check_interval=30,
            **self.options(),
        )
