"""Cluster-wide per-class statistics shared by all replicas through Redis.

The request path only touches memory: `record()` adds to a local delta buffer
and `cluster_totals()` reads the last merged snapshot. One background task does
all Redis I/O: every `flush_interval_s` (or earlier, once `flush_max_outcomes`
outcomes are pending) it pushes the whole batch with one atomic script call
(see `scripts.FLUSH_BATCH`), and every `pull_interval_s` it reads the totals
of live classes in one pipelined round trip. At start it reads every known
class, so a new or restarted replica begins from what the cluster learned.

When Redis is slow or down, calls time out (bounded), the state turns
`degraded` (not unready: the replica keeps deciding from local state), the
unsent batch is kept and retried with the same batch id (exactly once, see the
marker in the script), new deltas keep merging locally, and the loop reconnects
with exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.state.backoff import Backoff, stop_task
from gateway.state.client import bounded_redis
from gateway.state.deltas import ClassDelta, ClassSnapshot, DeltaBuffer
from gateway.state.scripts import FLUSH_BATCH
from gateway.state.settings import ClassStateSettings

log = logging.getLogger(__name__)

StoreStatus = Literal["ok", "degraded"]
SnapshotListener = Callable[[Mapping[str, ClassSnapshot]], None]
# Errors of an unreachable, slow or restarting Redis; anything else is a bug and is logged loudly.
REDIS_DOWN = (RedisError, OSError, asyncio.TimeoutError)
BATCH_MARKER_TTL_S = 3600


@dataclass(frozen=True, slots=True)
class StoreStats:
    """Counters for `/ready` details and the metrics exporter (which the lead owns)."""

    status: StoreStatus
    flushes_total: int
    flush_failures_total: int
    pulls_total: int
    pull_failures_total: int
    pending_classes: int
    dropped_deltas_total: int
    warmed: bool
    last_ok_unix: float | None


def parse_class_hash(raw: Mapping[str, str]) -> ClassSnapshot:
    counters = {k[2:]: float(v) for k, v in raw.items() if k.startswith("c:")}
    meta = {k[2:]: v for k, v in raw.items() if k.startswith("m:")}
    return ClassSnapshot(counters=counters, meta=meta)


class RedisClassStore:
    """Batched, non-blocking sync of additive per-class statistics with Redis."""

    def __init__(self, settings: ClassStateSettings, redis: Redis | None = None) -> None:
        self._s = settings
        self._redis = redis or bounded_redis(
            settings.redis_url,
            op_timeout_s=settings.op_timeout_s,
            connect_timeout_s=settings.connect_timeout_s,
        )
        self._prefix = settings.key_prefix()
        self._index_key = f"{self._prefix}:classes"
        self._replica = uuid.uuid4().hex[:12]
        self._seq = 0
        self._pending = DeltaBuffer(settings.max_classes)
        self._inflight: tuple[str, dict[str, ClassDelta]] | None = None
        self._remote: dict[str, ClassSnapshot] = {}
        self._own_flushed: dict[str, dict[str, float]] = {}
        self._listeners: list[SnapshotListener] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._backoff = Backoff(settings.backoff_initial_s, settings.backoff_max_s)
        self._script = self._redis.register_script(FLUSH_BATCH)
        self._status: StoreStatus = "ok"
        self._warmed = False
        self._last_pull = 0.0
        self._last_ok: float | None = None
        self._counts = {"flushes": 0, "flush_failures": 0, "pulls": 0, "pull_failures": 0}

    # ---- request path: memory only -------------------------------------------------
    def record(
        self,
        class_id: str,
        counters: Mapping[str, float],
        meta: Mapping[str, str] | None = None,
        outcomes: int = 1,
    ) -> None:
        """Add one outcome's (or a batch's) counter increments; never does I/O."""
        self._pending.add(class_id, counters, meta, outcomes)
        if self._pending.outcomes >= self._s.flush_max_outcomes:
            self._wake.set()

    def record_many(
        self,
        deltas: Mapping[str, Mapping[str, float]],
        meta: Mapping[str, Mapping[str, str]] | None = None,
        outcomes: int = 1,
    ) -> None:
        """Add the controller's `export_deltas()` shape: class id -> counter -> increment."""
        meta = meta or {}
        for class_id in deltas.keys() | meta.keys():
            self._pending.add(class_id, deltas.get(class_id, {}), meta.get(class_id), 0)
        self._pending.outcomes += outcomes
        if self._pending.outcomes >= self._s.flush_max_outcomes:
            self._wake.set()

    def cluster_totals(self) -> dict[str, ClassSnapshot]:
        """Merged totals of all replicas as last read, plus this replica's unsent deltas."""
        out: dict[str, ClassSnapshot] = {}
        unsent = self._unsent()
        for class_id in self._remote.keys() | unsent.keys():
            base = self._remote.get(class_id, ClassSnapshot({}, {}))
            extra = unsent.get(class_id)
            if extra is None:
                out[class_id] = base
                continue
            counters = dict(base.counters)
            for name, inc in extra.counters.items():
                counters[name] = counters.get(name, 0.0) + inc
            out[class_id] = ClassSnapshot(counters, {**base.meta, **extra.meta})
        return out

    def remote_totals(self) -> dict[str, ClassSnapshot]:
        """Totals without what this store instance pushed itself.

        This is the evidence of other replicas (and of earlier lives of this one),
        for a controller that already holds its own local statistics and must not
        count them twice. Clamped at zero per counter in case keys expired.
        """
        out: dict[str, ClassSnapshot] = {}
        for class_id, snap in self._remote.items():
            own = self._own_flushed.get(class_id, {})
            counters = {
                name: max(0.0, total - own.get(name, 0.0)) for name, total in snap.counters.items()
            }
            out[class_id] = ClassSnapshot(counters, snap.meta)
        return out

    @property
    def status(self) -> StoreStatus:
        """`ok` or `degraded`; degraded means "deciding from local state", never unready."""
        return self._status

    def stats(self) -> StoreStats:
        return StoreStats(
            status=self._status,
            flushes_total=self._counts["flushes"],
            flush_failures_total=self._counts["flush_failures"],
            pulls_total=self._counts["pulls"],
            pull_failures_total=self._counts["pull_failures"],
            pending_classes=len(self._unsent()),
            dropped_deltas_total=self._pending.dropped,
            warmed=self._warmed,
            last_ok_unix=self._last_ok,
        )

    def add_listener(self, listener: SnapshotListener) -> None:
        """Called (on the event loop) with the full merged snapshot after each read."""
        self._listeners.append(listener)

    # ---- lifecycle -------------------------------------------------------------------
    async def start(self) -> None:
        """Warm from Redis (bounded by `startup_timeout_s`), then run the sync loop."""
        if self._task is not None:
            return
        try:
            await asyncio.wait_for(self._pull(warm=True), self._s.startup_timeout_s)
            self._mark_ok()
        except REDIS_DOWN as exc:
            self._mark_degraded("warm-up read", exc)
        self._task = asyncio.create_task(self._run(), name="specgw-class-store")

    async def close(self, flush: bool = True) -> None:
        """Stop the loop; by default try one last bounded flush of what is pending."""
        self._stopping = True
        if self._task is not None:
            await stop_task(self._task, self._s.flush_interval_s + self._s.op_timeout_s)
            self._task = None
        if flush:
            with contextlib.suppress(*REDIS_DOWN):
                await asyncio.wait_for(self._flush(), self._s.op_timeout_s * 2)
        await self._redis.aclose()

    async def flush_now(self) -> None:
        """Push pending deltas now (tests, shutdown); raises if Redis is away."""
        await self._flush()

    async def pull_now(self) -> None:
        """Read live classes now (tests); raises if Redis is away."""
        await self._pull(warm=not self._warmed)

    # ---- background loop -------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopping:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._s.flush_interval_s)
            self._wake.clear()
            try:
                await self._flush()
                if (
                    not self._warmed
                    or time.monotonic() - self._last_pull >= self._s.pull_interval_s
                ):
                    await self._pull(warm=not self._warmed)
                self._mark_ok()
            except REDIS_DOWN as exc:
                self._mark_degraded("sync", exc)
                await asyncio.sleep(self._backoff.next_delay())
            except Exception:
                # A bug, not an outage: keep the loop alive, keep local state, say so loudly.
                log.exception("class store sync failed unexpectedly")
                self._status = "degraded"
                await asyncio.sleep(self._backoff.next_delay())

    def _mark_ok(self) -> None:
        if self._status != "ok":
            log.info("redis class store recovered")
        self._status = "ok"
        self._last_ok = time.time()
        self._backoff.reset()

    def _mark_degraded(self, what: str, exc: BaseException) -> None:
        if self._status == "ok":
            log.warning("redis class store degraded (%s): %r; deciding from local state", what, exc)
        self._status = "degraded"

    def _unsent(self) -> dict[str, ClassDelta]:
        merged: dict[str, ClassDelta] = {}
        batches = [self._inflight[1]] if self._inflight else []
        batches.append(dict(self._pending.items()))
        for batch in batches:
            for class_id, delta in batch.items():
                merged.setdefault(class_id, ClassDelta()).absorb(delta)
        return merged

    async def _flush(self) -> None:
        if self._inflight is None:
            if not self._pending:
                return
            self._seq += 1
            self._inflight = (f"{self._replica}:{self._seq}", self._pending.take())
        batch_id, batch = self._inflight
        try:
            reply = await self._send(batch_id, batch)
        except REDIS_DOWN:
            self._counts["flush_failures"] += 1
            raise
        # Applied (or already applied by an earlier attempt whose reply was lost).
        self._inflight = None
        self._counts["flushes"] += 1
        for class_id, delta in batch.items():
            own = self._own_flushed.setdefault(class_id, {})
            for name, inc in delta.counters.items():
                own[name] = own.get(name, 0.0) + inc
        for class_id, raw in zip(batch, reply[1:], strict=True):
            self._remote[class_id] = parse_class_hash(_pairs(raw))

    async def _send(self, batch_id: str, batch: Mapping[str, ClassDelta]) -> list[Any]:
        payload = [
            {
                "id": class_id,
                "c": {k: repr(v) for k, v in d.counters.items()},
                "m": dict(d.meta),
            }
            for class_id, d in batch.items()
        ]
        keys = [self._index_key, f"{self._prefix}:batch:{batch_id}"]
        keys += [self._class_key(c) for c in batch]
        args: list[str | int | float] = [
            self._s.key_ttl_s,
            time.time(),
            BATCH_MARKER_TTL_S,
            json.dumps(payload),
        ]
        reply = await self._script(keys=keys, args=args)
        return list(reply)

    async def _pull(self, warm: bool) -> None:
        try:
            if warm:
                found = await self._redis.zrange(
                    self._index_key, 0, self._s.max_classes - 1, desc=True
                )
            else:
                found = await self._redis.zrangebyscore(
                    self._index_key,
                    time.time() - self._s.live_window_s,
                    "+inf",
                    start=0,
                    num=self._s.max_classes,
                )
            ids = [str(class_id) for class_id in found]
            async with self._redis.pipeline(transaction=False) as pipe:
                for class_id in ids:
                    pipe.hgetall(self._class_key(class_id))
                rows = await pipe.execute() if ids else []
        except REDIS_DOWN:
            self._counts["pull_failures"] += 1
            raise
        for class_id, raw in zip(ids, rows, strict=True):
            if raw:
                self._remote[class_id] = parse_class_hash(raw)
        self._counts["pulls"] += 1
        self._last_pull = time.monotonic()
        self._warmed = True
        snapshot = self.cluster_totals()
        for listener in self._listeners:
            try:
                listener(snapshot)
            except Exception:
                log.exception("class store listener failed")

    def _class_key(self, class_id: str) -> str:
        return f"{self._prefix}:class:{class_id}"


def _pairs(raw: Any) -> dict[str, str]:
    """A Lua-returned HGETALL is a flat [field, value, ...] list."""
    if isinstance(raw, dict):
        return raw
    items = list(raw)
    return dict(zip(items[0::2], items[1::2], strict=True))
