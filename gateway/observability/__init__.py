"""Observability: the `specgw_*` metrics catalogue, the `/metrics` rendering, tracing.

The `specgw_*` families are defined in four modules, one per label set: `metrics`
(per class; `GatewayMetrics` also carries the replica's), `replica_metrics` (per replica),
`key_metrics` (per key label) and `edge_metrics` (the connection edge, read at scrape);
`tracing.setup_tracing` wires OpenTelemetry (off unless an OTLP endpoint is set);
`events` subscribes both to the controller's `ControlEvents`.
"""
