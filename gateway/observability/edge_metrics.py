"""The families the app exports before and beside its runtime: the connection edge's
counters (`gateway.connections.EdgeStats`) and the replica's phase (`gateway.phase`).

The edge counts in plain integers on the server's hot path (one per connection event, no
lock: the protocol and the app share one event loop); these collectors read them at
scrape time, so the hot path pays nothing for the export. The registry exists from
`create_app` on, so `/metrics` serves them while the engine loads::

    specgw_open_connections                      gauge, connections open now
    specgw_edge_closed_total{reason}             connections the edge ended, by reason:
        header_timeout, body_timeout, header_too_large, connection_limit
    specgw_phase{phase}                          state set: 1 for the replica's phase, 0 for
        the others: loading, calibrating, ready, restarting, draining

Alert on a rising `rate(specgw_edge_closed_total{reason="header_timeout"}[5m])`
(slow-client floods) and on `specgw_open_connections` near the replica's bound. A start-up
or a restart shows as `specgw_phase{phase="ready"} == 0` with the phase it is in::

    max by (instance, phase) (specgw_phase == 1)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.connections import EdgeStats
from gateway.phase import Phase, PhaseBoard


class EdgeCollector(Collector):
    """Reads one `EdgeStats` at each scrape."""

    def __init__(self, stats: EdgeStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        s = self._stats
        yield GaugeMetricFamily(
            "specgw_open_connections",
            "Client connections open on this replica.",
            value=s.open_connections,
        )
        closed = CounterMetricFamily(
            "specgw_edge_closed",
            "Connections the edge ended before or while reading a request, by reason.",
            labels=["reason"],
        )
        closed.add_metric(["header_timeout"], s.header_timeouts)
        closed.add_metric(["body_timeout"], s.body_timeouts)
        closed.add_metric(["header_too_large"], s.headers_too_large)
        closed.add_metric(["connection_limit"], s.connections_refused)
        yield closed


class PhaseCollector(Collector):
    """Reads one `PhaseBoard` at each scrape: `specgw_phase{phase}`, one series per phase."""

    def __init__(self, board: PhaseBoard) -> None:
        self._board = board

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "specgw_phase",
            "1 for the phase the replica is in (loading, calibrating, ready, restarting, "
            "draining), 0 for the others.",
            labels=["phase"],
        )
        for phase in Phase:
            family.add_metric([phase.value], 1.0 if phase is self._board.phase else 0.0)
        yield family


def edge_registry(stats: EdgeStats, phases: PhaseBoard | None = None) -> CollectorRegistry:
    """A registry holding only the app's own families (rendered after the runtime's)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(EdgeCollector(stats))
    if phases is not None:
        registry.register(PhaseCollector(phases))
    return registry


def render_alone(registry: CollectorRegistry) -> Callable[[], tuple[bytes, str]]:
    """`/metrics` before the runtime exists: the app's own families only."""
    return lambda: (generate_latest(registry), CONTENT_TYPE_LATEST)


def with_edge(
    render: Callable[[], tuple[bytes, str]], registry: CollectorRegistry
) -> Callable[[], tuple[bytes, str]]:
    """`render` (the runtime's `/metrics` body) followed by the edge's families."""

    def rendered() -> tuple[bytes, str]:
        body, content_type = render()
        return body + generate_latest(registry), content_type

    return rendered
