"""Where traces go, read from the standard `OTEL_*` environment, then from the gateway's own.

The OpenTelemetry SDK environment specification
(https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/ and
https://opentelemetry.io/docs/specs/otel/protocol/exporter/) defines the variables a
collector-side operator already sets for every service; the gateway honours them:

* endpoint: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is), else
  `OTEL_EXPORTER_OTLP_ENDPOINT` (over HTTP, `/v1/traces` appended to it), else the
  gateway's `otel_endpoint` setting (`SPECGW_OTEL_ENDPOINT`, used as is). None of them:
  tracing is off.
* protocol: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`, else
  `http/protobuf`. `grpc` needs `opentelemetry-exporter-otlp-proto-grpc`, which the
  gateway does not require: asked for without it, start-up fails and says so.
* headers, timeout, compression, certificates (`OTEL_EXPORTER_OTLP_[TRACES_]HEADERS`, ...):
  read by the exporter itself.
* `OTEL_SERVICE_NAME` > `service.name` in `OTEL_RESOURCE_ATTRIBUTES` > `spec-gateway`.
* `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default `parentbased_always_on`).
* `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`: tracing off.

A value the gateway cannot honour (an unknown sampler, a ratio outside [0, 1], the
`http/json` protocol, which the Python SDK has no exporter for) is a `ValueError` at
start-up that names the variable, not a silent fallback.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)

DEFAULT_SERVICE_NAME = "spec-gateway"
HTTP_PROTOBUF = "http/protobuf"
GRPC = "grpc"
#: Appended to `OTEL_EXPORTER_OTLP_ENDPOINT` for traces over HTTP (the exporter spec).
TRACES_PATH = "v1/traces"

_SAMPLERS: dict[str, Callable[[float], Sampler]] = {
    "always_on": lambda _: ALWAYS_ON,
    "always_off": lambda _: ALWAYS_OFF,
    "traceidratio": TraceIdRatioBased,
    "parentbased_always_on": lambda _: ParentBased(ALWAYS_ON),
    "parentbased_always_off": lambda _: ParentBased(ALWAYS_OFF),
    "parentbased_traceidratio": lambda ratio: ParentBased(TraceIdRatioBased(ratio)),
}


@dataclass(frozen=True, slots=True)
class TraceExport:
    """The resolved destination of the gateway's traces."""

    endpoint: str
    protocol: str
    #: The variable (or setting) the endpoint came from, for the start-up log line.
    source: str

    def exporter(self) -> SpanExporter:
        """The OTLP exporter for this destination (headers etc. from the environment)."""
        if self.protocol == GRPC:
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                    OTLPSpanExporter as GrpcExporter,
                )
            except ImportError:
                raise ValueError(
                    "OTLP protocol grpc needs the opentelemetry-exporter-otlp-proto-grpc "
                    "package, which is not installed: install it, or set "
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={HTTP_PROTOBUF}"
                ) from None
            return GrpcExporter(endpoint=self.endpoint)
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=self.endpoint)


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """(name, value) of the first variable set to a non-blank value."""
    for name in names:
        value = environ.get(name, "").strip()
        if value:
            return name, value
    return None


def _protocol(environ: Mapping[str, str]) -> str:
    found = _first(environ, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
    if found is None:
        return HTTP_PROTOBUF
    name, value = found
    if value not in (HTTP_PROTOBUF, GRPC):
        raise ValueError(
            f"{name}={value!r}: the gateway exports traces over {HTTP_PROTOBUF} or {GRPC}"
        )
    return value


def _endpoint(
    environ: Mapping[str, str], protocol: str, fallback: str | None
) -> tuple[str, str] | None:
    """(endpoint, source); the base endpoint gets the traces path over HTTP only."""
    found = _first(environ, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if found is not None:
        return found[1], found[0]
    found = _first(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
    if found is not None:
        name, base = found
        if protocol == GRPC:
            return base, name
        return f"{base.removesuffix('/')}/{TRACES_PATH}", name
    if fallback:
        return fallback, "SPECGW_OTEL_ENDPOINT"
    return None


def sampler_from_env(environ: Mapping[str, str] | None = None) -> tuple[str, Sampler]:
    """(name, sampler) from `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG`."""
    env = os.environ if environ is None else environ
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    build = _SAMPLERS.get(name)
    if build is None:
        known = ", ".join(sorted(_SAMPLERS))
        raise ValueError(f"OTEL_TRACES_SAMPLER={name!r}: the gateway knows {known}")
    raw = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    ratio = 1.0
    if raw and name.endswith("traceidratio"):
        try:
            ratio = float(raw)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"OTEL_TRACES_SAMPLER_ARG={raw!r}: a ratio in [0, 1]")
    label = f"{name}({ratio:g})" if name.endswith("traceidratio") else name
    return label, build(ratio)


def resource_from_env(environ: Mapping[str, str] | None = None) -> Resource:
    """The SDK's resource (`telemetry.sdk.*`, `OTEL_RESOURCE_ATTRIBUTES`) with the gateway's
    `service.name` as the default the environment overrides, not the other way round."""
    env = os.environ if environ is None else environ
    attributes: dict[str, str] = {SERVICE_NAME: DEFAULT_SERVICE_NAME}
    for pair in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        key, sep, value = pair.partition("=")
        if sep and key.strip():
            attributes[key.strip()] = unquote(value.strip())
    service = env.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        attributes[SERVICE_NAME] = service
    return Resource.create(attributes)


def trace_export_from_env(
    fallback_endpoint: str | None, environ: Mapping[str, str] | None = None
) -> TraceExport | None:
    """Where to export traces, or None when tracing is off (see the module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    exporter = env.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    if exporter == "none":
        return None
    if exporter != "otlp":
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter!r}: the gateway exports otlp or none")
    protocol = _protocol(env)
    found = _endpoint(env, protocol, fallback_endpoint)
    if found is None:
        return None
    return TraceExport(found[0], protocol, found[1])
