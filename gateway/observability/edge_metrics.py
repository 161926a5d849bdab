"""The connection edge's counters (`gateway.connections.EdgeStats`) as Prometheus families.

The edge counts in plain integers on the server's hot path (one per connection event, no
lock: the protocol and the app share one event loop); this collector reads them at
scrape time, so the hot path pays nothing for the export::

    specgw_open_connections                      gauge, connections open now
    specgw_edge_closed_total{reason}             connections the edge ended, by reason:
        header_timeout, body_timeout, header_too_large, connection_limit

Alert on a rising `rate(specgw_edge_closed_total{reason="header_timeout"}[5m])`
(slow-client floods) and on `specgw_open_connections` near the replica's bound.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.connections import EdgeStats


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


def edge_registry(stats: EdgeStats) -> CollectorRegistry:
    """A registry holding only the edge's families (rendered after the runtime's)."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(EdgeCollector(stats))
    return registry


def with_edge(
    render: Callable[[], tuple[bytes, str]], registry: CollectorRegistry
) -> Callable[[], tuple[bytes, str]]:
    """`render` (the runtime's `/metrics` body) followed by the edge's families."""

    def rendered() -> tuple[bytes, str]:
        body, content_type = render()
        return body + generate_latest(registry), content_type

    return rendered
