"""What one replica runs per key: who keys are, their limiter, their metrics."""

from __future__ import annotations

from contextlib import AsyncExitStack
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from gateway.admission import Admission
from gateway.observability.key_metrics import KeyMetrics
from gateway.settings import GatewaySettings
from gateway.state.connection import RedisConnection
from gateway.tenants.directory import TenantDirectory
from gateway.tenants.limiter import KeyLimiter


@dataclass
class KeyLimits:
    directory: TenantDirectory
    limiter: KeyLimiter
    metrics: KeyMetrics

    @classmethod
    async def start(
        cls,
        stack: AsyncExitStack,
        settings: GatewaySettings,
        registry: CollectorRegistry,
        connection: RedisConnection | None,
    ) -> KeyLimits:
        """Build and start them; the limiter's Redis client closes with `stack`.

        Redis keys share the class store's namespace (`namespace`):
        `specgw:{namespace}:rl:<digest>:{requests,tokens,inflight}`.
        """
        directory = TenantDirectory(settings.tenants, settings.api_keys)
        metrics = KeyMetrics(registry, directory.labels)
        prefix = settings.state.key_prefix()
        limiter = KeyLimiter.connect(
            settings.tenants, connection, key_prefix=prefix, events=metrics
        )
        await limiter.start()
        stack.push_async_callback(limiter.close)
        return cls(directory, limiter, metrics)

    def admission(self, settings: GatewaySettings) -> Admission:
        """Admission with each key's weight from the config."""
        return Admission(
            settings.max_running,
            settings.max_queued,
            settings.queue_timeout_s,
            weight_of=self.directory.weight_of,
        )

    def export(self, admission: Admission) -> None:
        """At scrape time: the limiter's mode and each key label's running and queued."""
        self.metrics.set_mode(self.limiter.mode)
        by_label: dict[str, tuple[int, int]] = {}
        for key, (running, queued) in admission.load_by_key().items():
            label = self.directory.label_of(key)
            was_running, was_queued = by_label.get(label, (0, 0))
            by_label[label] = (was_running + running, was_queued + queued)
        self.metrics.set_load(by_label)

    def readiness(self) -> dict[str, str]:
        """`/ready`'s detail: where limits are decided (never a reason to be unready)."""
        return {"ratelimit": self.limiter.describe()}
