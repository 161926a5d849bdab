"""Resolved flags per request class, cached so the hot path is one dict lookup.

Providers are chained through OpenFeature: Redis overrides first, then the
flagd-format file (flagd's in-process FILE resolver, which reads the file,
evaluates its targeting rules on the `class` / `label` context attributes, and
re-reads it when the mtime of the resolved path changes: a ConfigMap update
swaps the `..data` symlink to a new directory, which changes that mtime), then
the code defaults. A miss evaluates six flags (about 30 µs each with flagd);
every provider change event clears the cache, and registered listeners are
told on the event loop. A provider error (a file that does not parse, or is gone)
changes nothing (the last good flags stay in force) and is counted in
`source_errors`.

The view keeps no timer of its own: the file is re-read by flagd's watcher thread
every `file_poll_interval_s`, and Redis overrides follow pub/sub and the override
provider's poll, so the tests wait on those sources' conditions, not on a clock.

OpenFeature keeps providers in a process-wide registry; each view binds its
providers to its own domains (`specgw-<n>-file`, `specgw-<n>-overrides`), so
two views (two app instances in one test process) never see each other's flags.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import threading
from collections.abc import Callable
from typing import Any, cast

from openfeature import api
from openfeature.client import OpenFeatureClient
from openfeature.contrib.provider.flagd import FlagdProvider
from openfeature.contrib.provider.flagd.config import ResolverType
from openfeature.evaluation_context import EvaluationContext
from openfeature.event import EventDetails, ProviderEvent
from openfeature.provider import FeatureProvider
from openfeature.provider.no_op_provider import NoOpProvider

from gateway.flags.redis_provider import REDIS_DOWN, RedisOverrideProvider
from gateway.flags.settings import FlagSettings
from gateway.flags.values import (
    SPECS,
    FlagValue,
    FlagValues,
    default_of,
    to_field,
)

log = logging.getLogger(__name__)
FLAGS_FILE = "flags.json"
_domains = itertools.count()
ChangeListener = Callable[[], None]
_EVENTS = (ProviderEvent.PROVIDER_CONFIGURATION_CHANGED, ProviderEvent.PROVIDER_READY)


class FlagView:
    """`overrides_for(class_id, label)` -> FlagValues, from overrides > file > defaults."""

    def __init__(
        self,
        settings: FlagSettings,
        defaults: FlagValues | None = None,
        overrides: RedisOverrideProvider | None = None,
    ) -> None:
        self._s = settings
        self._defaults = defaults or FlagValues()
        self._overrides = overrides
        if overrides is None and settings.redis_url is not None:
            self._overrides = RedisOverrideProvider(settings)
        self._domain = f"specgw-{next(_domains)}"
        self._cache: dict[tuple[str, str], FlagValues] = {}
        self._generation = 0
        self._lock = threading.Lock()
        self._listeners: list[ChangeListener] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clients: list[OpenFeatureClient] = []
        #: Errors the flag sources reported (flagd's file watcher, once per failed read).
        self.source_errors = 0

    # ---- hot path -------------------------------------------------------------------------
    def overrides_for(self, class_id: str, label: str = "") -> FlagValues:
        """Flags for one class: a dict lookup unless a change cleared the cache."""
        hit = self._cache.get((class_id, label))
        if hit is not None:
            return hit
        return self._resolve(class_id, label)

    # ---- lifecycle ------------------------------------------------------------------------
    async def start(self) -> None:
        """Bind the providers (waiting for the first file read) and start following Redis."""
        self._loop = asyncio.get_running_loop()
        if self._overrides is not None:
            await self._overrides.start(timeout_s=self._s.op_timeout_s * 4)
            self._bind("overrides", self._overrides)
        if self._s.flags_dir is not None:
            path = self._s.flags_dir / FLAGS_FILE
            provider = FlagdProvider(
                resolver_type=ResolverType.FILE,
                offline_flag_source_path=str(path),
                deadline_ms=int(self._s.file_poll_interval_s * 1000),
            )
            # A missing or broken file is not fatal: defaults apply until a good one appears.
            await asyncio.to_thread(self._bind, "file", provider)
        self.invalidate()

    async def close(self) -> None:
        for client in self._clients:
            for event in _EVENTS:
                client.remove_handler(event, self._on_provider_event)
            client.remove_handler(ProviderEvent.PROVIDER_ERROR, self._on_provider_error)
        for name in ("overrides", "file"):
            api.set_provider(NoOpProvider(), domain=f"{self._domain}-{name}")
        self._clients.clear()
        if self._overrides is not None:
            await self._overrides.close()

    async def catch_up(self) -> None:
        """Read the Redis overrides now: the replica that took an admin write answers with
        it at once (read-your-writes); the others follow the change notice."""
        if self._overrides is not None:
            # The write is done; a read-back that fails leaves the follower to catch up.
            with contextlib.suppress(*REDIS_DOWN):
                await self._overrides.reload()

    def add_listener(self, listener: ChangeListener) -> None:
        """Called on the event loop after any flag source changed (cache already cleared)."""
        self._listeners.append(listener)

    @property
    def redis_status(self) -> str | None:
        """`ok` / `degraded` for `/ready` details; None without Redis overrides."""
        return None if self._overrides is None else self._overrides.status

    def invalidate(self) -> None:
        with self._lock:
            self._generation += 1
            self._cache = {}
        if self._loop is not None and not self._loop.is_closed():
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._notify)

    # ---- internals ------------------------------------------------------------------------
    def _bind(self, name: str, provider: FeatureProvider) -> None:
        domain = f"{self._domain}-{name}"
        try:
            api.set_provider_and_wait(provider, domain=domain)
        except Exception as exc:
            log.warning("flag provider %s not ready yet (%r); using lower layers", name, exc)
        client = api.get_client(domain)
        for event in _EVENTS:
            client.add_handler(event, self._on_provider_event)
        client.add_handler(ProviderEvent.PROVIDER_ERROR, self._on_provider_error)
        self._clients.append(client)

    def _on_provider_event(self, details: EventDetails) -> None:
        log.info("flags changed (%s): %s", details.provider_name, details.flags_changed or "all")
        self.invalidate()

    def _on_provider_error(self, details: EventDetails) -> None:
        # flagd logs each failed read itself; the view only counts them.
        with self._lock:
            self.source_errors += 1

    def _notify(self) -> None:
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("flag change listener failed")

    def _resolve(self, class_id: str, label: str) -> FlagValues:
        generation = self._generation
        context = EvaluationContext(attributes={"class": class_id, "label": label})
        fields: dict[str, Any] = {}
        for flag, spec in SPECS.items():
            value = self._evaluate(flag, context)
            if not spec.check(value):
                log.warning("flag %s=%r out of bounds for class %s; default", flag, value, class_id)
                value = default_of(self._defaults, flag)
            fields[spec.field] = to_field(flag, value)
        if fields["k_min"] > fields["k_max"]:
            log.warning(
                "k-min %s > k-max %s for class %s", fields["k_min"], fields["k_max"], class_id
            )
            fields["k_min"] = fields["k_max"]
        values = FlagValues(**fields)
        with self._lock:
            if generation == self._generation:
                if len(self._cache) >= self._s.cache_max_entries:
                    self._cache = {}  # more (class, label) pairs than the class limit: start over
                self._cache[(class_id, label)] = values
        return values

    def _evaluate(self, flag: str, context: EvaluationContext) -> FlagValue:
        default = default_of(self._defaults, flag)
        kind = SPECS[flag].kind
        for client in self._clients:
            getters: dict[type, Callable[..., Any]] = {
                bool: client.get_boolean_details,
                str: client.get_string_details,
                int: client.get_integer_details,
                float: client.get_float_details,
            }
            getter = getters[kind]
            details = getter(flag, cast(Any, default), context)
            if details.error_code is None:
                return cast(FlagValue, details.value)
        return default
