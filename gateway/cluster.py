"""Sharing the controller's evidence across replicas through Redis.

Every `interval_s` the controller's additive deltas go to the class store (which
batches them into one atomic Lua call per flush) and the other replicas' totals
come back through `Controller.merge`. All of it runs off the request path; a
slow or absent Redis only delays sharing, and the store reports `degraded`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.control.controller import Controller
from gateway.state import RedisClassStore

log = logging.getLogger("specgw.cluster")


class ClusterSync:
    def __init__(
        self, controller: Controller, store: RedisClassStore, interval_s: float = 0.5
    ) -> None:
        self._controller = controller
        self._store = store
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None

    def sync_once(self) -> None:
        deltas = self._controller.export_deltas()
        if deltas.counters:
            self._store.record_many(deltas.counters, deltas.meta, outcomes=deltas.outcomes)
        remote = self._store.remote_totals()
        if remote:
            self._controller.merge(
                {cid: snap.counters for cid, snap in remote.items()},
                {cid: snap.meta for cid, snap in remote.items()},
            )

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                self.sync_once()
            except Exception:  # sharing must never take the replica down
                log.exception("cluster sync failed; retrying")

    def start(self) -> None:
        self.sync_once()
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.sync_once()
