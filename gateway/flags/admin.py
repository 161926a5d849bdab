"""Get, set and unset runtime flag overrides, each change audited.

A change is one Lua script call, so the override, the version bump, the audit
entry (`XADD` to a capped stream: who, when, flag, target, old, new) and the
change notification (`PUBLISH`) happen together or not at all. Every change is
also logged. The HTTP routes and the CLI sit on top of this service.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from gateway.flags.overrides import (
    OverrideKeys,
    Target,
    decode,
    encode,
    field_name,
    parse_field,
)
from gateway.flags.settings import FlagSettings
from gateway.flags.values import SPECS, FlagValue, FlagValueError, coerce

log = logging.getLogger(__name__)

# KEYS: hash, version, audit stream. ARGV: field, new JSON ('' = unset), who, flag,
# target, audit max length, channel, unix time. Returns {old JSON or '', version, entry id}.
CHANGE_SCRIPT = """
local old = redis.call('HGET', KEYS[1], ARGV[1]) or ''
local action = 'set'
if ARGV[2] == '' then
  action = 'unset'
  redis.call('HDEL', KEYS[1], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
end
local version = redis.call('INCR', KEYS[2])
local id = redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*',
  'who', ARGV[3], 'action', action, 'flag', ARGV[4], 'target', ARGV[5],
  'old', old, 'new', ARGV[2], 'at', ARGV[8])
redis.call('PUBLISH', ARGV[7], version)
return {old, version, id}
"""


@dataclass(frozen=True, slots=True)
class FlagOverride:
    flag: str
    target: str
    value: FlagValue


@dataclass(frozen=True, slots=True)
class AuditEntry:
    """One change as recorded in the audit stream; `old` / `new` None = no override."""

    id: str
    at: float
    who: str
    action: str
    flag: str
    target: str
    old: FlagValue | None
    new: FlagValue | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class FlagAdmin:
    """The operations behind `spec-gateway flags get|set|unset` and the admin routes."""

    def __init__(self, redis: Redis, settings: FlagSettings) -> None:
        self._redis = redis
        self._s = settings
        self.keys = OverrideKeys.for_prefix(settings.key_prefix())
        self._script = redis.register_script(CHANGE_SCRIPT)

    @classmethod
    def connect(cls, settings: FlagSettings) -> FlagAdmin:
        """An admin with its own bounded client; one retry covers a connection that died
        with a restarted Redis (a duplicate audit entry is the worst a retry can do)."""
        if settings.redis_url is None:
            raise ValueError("FlagAdmin needs settings.redis_url")
        redis = Redis.from_url(
            settings.redis_url,
            socket_timeout=settings.op_timeout_s * 4,
            socket_connect_timeout=settings.op_timeout_s * 4,
            retry=Retry(NoBackoff(), 1),
            decode_responses=True,
        )
        return cls(redis, settings)

    async def close(self) -> None:
        await self._redis.aclose()

    async def get(self, flag: str | None = None) -> list[FlagOverride]:
        """Current overrides, optionally of one flag, sorted by flag then target."""
        if flag is not None and flag not in SPECS:
            raise FlagValueError(f"unknown flag {flag!r}; known: {', '.join(SPECS)}")
        raw = await self._redis.hgetall(self.keys.hash)
        out = []
        for field, text in raw.items():
            name, target = parse_field(str(field))
            if flag is None or name == flag:
                out.append(FlagOverride(name, target.describe(), decode(str(text))))
        return sorted(out, key=lambda o: (o.flag, o.target))

    async def set(
        self, flag: str, value: FlagValue, *, who: str, target: Target | None = None
    ) -> AuditEntry:
        """Override `flag` (for all classes, or one class id / label); validated first."""
        return await self._change(flag, encode(coerce(flag, value)), who, target or Target())

    async def unset(self, flag: str, *, who: str, target: Target | None = None) -> AuditEntry:
        """Remove an override; the file value or the default applies again."""
        if flag not in SPECS:
            raise FlagValueError(f"unknown flag {flag!r}; known: {', '.join(SPECS)}")
        return await self._change(flag, "", who, target or Target())

    async def audit(self, count: int = 50) -> list[AuditEntry]:
        """The newest `count` changes, newest first."""
        rows = await self._redis.xrevrange(self.keys.audit, count=count) or []
        return [_entry(str(entry_id), dict(fields or {})) for entry_id, fields in rows]

    async def _change(self, flag: str, new: str, who: str, target: Target) -> AuditEntry:
        now = time.time()
        keys = [self.keys.hash, self.keys.version, self.keys.audit]
        args: list[str | int | float] = [
            field_name(flag, target),
            new,
            who,
            flag,
            target.describe(),
            self._s.audit_max_len,
            self.keys.channel,
            now,
        ]
        old, _version, entry_id = await self._script(keys=keys, args=args)
        entry = AuditEntry(
            id=str(entry_id),
            at=now,
            who=who,
            action="set" if new else "unset",
            flag=flag,
            target=target.describe(),
            old=decode(old) if old else None,
            new=decode(new) if new else None,
        )
        log.info(
            "flag %s %s for %s by %s: %r -> %r",
            flag,
            entry.action,
            entry.target,
            who,
            entry.old,
            entry.new,
        )
        return entry


def _entry(entry_id: str, fields: dict[Any, Any]) -> AuditEntry:
    return AuditEntry(
        id=entry_id,
        at=float(fields.get("at", "0")),
        who=fields.get("who", ""),
        action=fields.get("action", ""),
        flag=fields.get("flag", ""),
        target=fields.get("target", ""),
        old=decode(fields["old"]) if fields.get("old") else None,
        new=decode(fields["new"]) if fields.get("new") else None,
    )
