"""OpenFeature provider for runtime flag overrides held in Redis.

Resolution reads an in-memory snapshot only (no I/O on evaluation). A
background task keeps the snapshot current: it subscribes to the change
channel and reloads on each message, and polls the version counter every
`override_poll_interval_s` in case a message was lost (pub/sub is
fire-and-forget), so a change reaches every replica within about a second.
When Redis is away the last snapshot stays in force, the provider reports
`degraded`, and the task reconnects with backoff. Layout: see `overrides`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Literal, TypeVar

from openfeature.evaluation_context import EvaluationContext
from openfeature.event import ProviderEventDetails
from openfeature.exception import ErrorCode
from openfeature.flag_evaluation import FlagResolutionDetails, Reason
from openfeature.provider import AbstractProvider
from openfeature.provider.metadata import Metadata
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.flags.overrides import OverrideKeys, candidate_fields, decode
from gateway.flags.settings import FlagSettings
from gateway.flags.values import FlagValue
from gateway.state.backoff import Backoff, stop_task
from gateway.state.client import bounded_redis

log = logging.getLogger(__name__)
T = TypeVar("T")
REDIS_DOWN = (RedisError, OSError, asyncio.TimeoutError)


class RedisOverrideProvider(AbstractProvider):
    """Overrides by flag and target, from a Redis hash kept in memory."""

    def __init__(self, settings: FlagSettings, redis: Redis | None = None) -> None:
        super().__init__()
        if redis is None:
            if settings.redis_url is None:
                raise ValueError("RedisOverrideProvider needs settings.redis_url")
            redis = bounded_redis(
                settings.redis_url,
                op_timeout_s=settings.op_timeout_s,
                connect_timeout_s=settings.op_timeout_s,
            )
        self._redis = redis
        self._s = settings
        self.keys = OverrideKeys.for_prefix(settings.key_prefix())
        self._snapshot: dict[str, FlagValue] = {}
        self._version: str | None = None
        self._status: Literal["ok", "degraded"] = "degraded"
        self._backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s)
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.reloads = 0

    # ---- OpenFeature ------------------------------------------------------------------
    def get_metadata(self) -> Metadata:
        return Metadata(name="specgw-redis-overrides")

    def resolve_boolean_details(
        self,
        flag_key: str,
        default_value: bool,
        evaluation_context: EvaluationContext | None = None,
    ) -> FlagResolutionDetails[bool]:
        return self._resolve(flag_key, default_value, evaluation_context, (bool,))

    def resolve_string_details(
        self, flag_key: str, default_value: str, evaluation_context: EvaluationContext | None = None
    ) -> FlagResolutionDetails[str]:
        return self._resolve(flag_key, default_value, evaluation_context, (str,))

    def resolve_integer_details(
        self, flag_key: str, default_value: int, evaluation_context: EvaluationContext | None = None
    ) -> FlagResolutionDetails[int]:
        return self._resolve(flag_key, default_value, evaluation_context, (int,))

    def resolve_float_details(
        self,
        flag_key: str,
        default_value: float,
        evaluation_context: EvaluationContext | None = None,
    ) -> FlagResolutionDetails[float]:
        return self._resolve(flag_key, default_value, evaluation_context, (float, int))

    def resolve_object_details(
        self, flag_key: str, default_value: Any, evaluation_context: EvaluationContext | None = None
    ) -> FlagResolutionDetails[Any]:
        return FlagResolutionDetails(
            default_value, error_code=ErrorCode.TYPE_MISMATCH, reason=Reason.ERROR
        )

    def _resolve(
        self,
        flag_key: str,
        default: T,
        context: EvaluationContext | None,
        kinds: tuple[type, ...],
    ) -> FlagResolutionDetails[T]:
        attrs: Mapping[str, Any] = context.attributes if context is not None else {}
        class_id, label = attrs.get("class"), attrs.get("label")
        snapshot = self._snapshot
        for field in candidate_fields(flag_key, class_id, label):
            if field not in snapshot:
                continue
            value = snapshot[field]
            if isinstance(value, bool) and bool not in kinds:
                break
            if not isinstance(value, kinds):
                break
            if float in kinds:
                value = float(value)
            reason = Reason.STATIC if field == flag_key else Reason.TARGETING_MATCH
            return FlagResolutionDetails(value, reason=reason, variant=field)  # type: ignore[arg-type]
        else:
            return FlagResolutionDetails(
                default, error_code=ErrorCode.FLAG_NOT_FOUND, reason=Reason.DEFAULT
            )
        return FlagResolutionDetails(
            default, error_code=ErrorCode.TYPE_MISMATCH, reason=Reason.ERROR
        )

    # ---- sync with Redis ----------------------------------------------------------------
    @property
    def status(self) -> Literal["ok", "degraded"]:
        return self._status

    def snapshot(self) -> dict[str, FlagValue]:
        return dict(self._snapshot)

    async def start(self, timeout_s: float = 2.0) -> None:
        """Load once (bounded; failure leaves no overrides and `degraded`), then follow changes."""
        with contextlib.suppress(*REDIS_DOWN):
            await asyncio.wait_for(self.reload(), timeout_s)
        if self._task is None:
            self._task = asyncio.create_task(self._follow(), name="specgw-flag-overrides")

    async def close(self) -> None:
        self._stopping = True
        if self._task is not None:
            await stop_task(self._task, self._s.override_poll_interval_s + self._s.op_timeout_s)
            self._task = None
        await self._redis.aclose()

    async def reload(self) -> None:
        """Read all overrides and the version in one transaction; emit a change if any."""
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(self.keys.hash)
                pipe.get(self.keys.version)
                raw, version = await pipe.execute()
        except REDIS_DOWN:
            self._set_status("degraded")
            raise
        self._set_status("ok")
        if _older(version, self._version):
            # A reload that read before a newer one (the follower's, beside an admin write's
            # read-back) finishing after it: its snapshot is stale, keep the newer one.
            return
        self._version = version
        fresh: dict[str, FlagValue] = {}
        for field, text in raw.items():
            try:
                fresh[field] = decode(text)
            except ValueError:
                log.warning("ignoring malformed flag override %s=%r", field, text)
        changed = sorted(
            k for k in fresh.keys() | self._snapshot.keys() if fresh.get(k) != self._snapshot.get(k)
        )
        self._snapshot = fresh
        self.reloads += 1
        if changed and hasattr(self, "_on_emit"):
            self.emit_provider_configuration_changed(ProviderEventDetails(flags_changed=changed))

    async def _follow(self) -> None:
        while not self._stopping:
            try:
                await self._follow_once()
            except REDIS_DOWN as exc:
                if self._status == "ok":
                    log.warning("flag overrides: redis unavailable (%r); keeping last values", exc)
                self._set_status("degraded")
                await asyncio.sleep(self._backoff.next_delay())
            except Exception:
                log.exception("flag override follower failed unexpectedly")
                self._set_status("degraded")
                await asyncio.sleep(self._backoff.next_delay())

    async def _follow_once(self) -> None:
        poll = self._s.override_poll_interval_s
        async with self._redis.pubsub() as pubsub:
            await asyncio.wait_for(pubsub.subscribe(self.keys.channel), self._s.op_timeout_s)
            await self.reload()  # after subscribing: no change can fall in between
            self._backoff.reset()
            while not self._stopping:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=poll)
                if message is not None:
                    await self.reload()
                    continue
                version = await self._redis.get(self.keys.version)
                if version != self._version:
                    log.info("flag overrides: change found by poll (pub/sub message missed)")
                    await self.reload()

    def _set_status(self, status: Literal["ok", "degraded"]) -> None:
        if status != self._status and status == "ok":
            log.info("flag overrides: redis available")
        self._status = status


def _older(version: Any, than: Any) -> bool:
    """Whether one read of the version counter (the admin script's INCR) is older than
    another; None or a value that is not a number (a counter reset by hand) is not."""
    try:
        return int(version) < int(than)
    except (TypeError, ValueError):
        return False
