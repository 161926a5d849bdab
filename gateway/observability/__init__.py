"""Observability: the `specgw_*` metrics catalogue, the `/metrics` rendering, tracing.

`metrics.GatewayMetrics` is the one place a `specgw_*` family is defined;
`tracing.setup_tracing` wires OpenTelemetry (off unless an OTLP endpoint is set);
`events` subscribes both to the controller's `ControlEvents`.
"""
