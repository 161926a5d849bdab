"""The standard `OTEL_*` variables, resolved (`gateway.observability.otlp`): endpoint,
protocol, service name, sampler, the gateway's setting as the fallback, and a clear
start-up error for what the gateway cannot honour."""

from __future__ import annotations

import sys

import pytest
from fastapi import FastAPI
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased

from gateway.observability.otlp import (
    TraceExport,
    resource_from_env,
    sampler_from_env,
    trace_export_from_env,
)
from gateway.observability.tracing import setup_tracing

SPECGW = "http://fallback:4318/v1/traces"


@pytest.mark.parametrize(
    ("env", "fallback", "expected"),
    [
        ({}, None, None),
        ({}, SPECGW, TraceExport(SPECGW, "http/protobuf", "SPECGW_OTEL_ENDPOINT")),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"},
            SPECGW,
            TraceExport(
                "http://collector:4318/v1/traces", "http/protobuf", "OTEL_EXPORTER_OTLP_ENDPOINT"
            ),
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://tempo:4318/otlp/v1/traces",
            },
            None,
            TraceExport(
                "http://tempo:4318/otlp/v1/traces",
                "http/protobuf",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            ),
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
            },
            None,
            TraceExport("http://collector:4317", "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT"),
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            },
            SPECGW,
            TraceExport(SPECGW, "http/protobuf", "SPECGW_OTEL_ENDPOINT"),
        ),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, None, None),
        ({"OTEL_TRACES_EXPORTER": "none"}, SPECGW, None),
    ],
)
def test_where_traces_go(
    env: dict[str, str], fallback: str | None, expected: TraceExport | None
) -> None:
    assert trace_export_from_env(fallback, env) == expected


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "udp"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(env: dict[str, str], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        trace_export_from_env(SPECGW, env)


def test_service_name_the_environment_overrides_the_default() -> None:
    def name(env: dict[str, str]) -> object:
        return resource_from_env(env).attributes["service.name"]

    assert name({}) == "spec-gateway"
    assert name({"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs,team=a%20b"}) == "from-attrs"
    both = {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from-attrs", "OTEL_SERVICE_NAME": "gw"}
    assert name(both) == "gw"
    assert resource_from_env({"OTEL_RESOURCE_ATTRIBUTES": "team=a%20b"}).attributes["team"] == "a b"


def test_samplers_by_name_and_ratio() -> None:
    label, sampler = sampler_from_env({})
    assert label == "parentbased_always_on"
    assert isinstance(sampler, ParentBased)
    assert sampler_from_env({"OTEL_TRACES_SAMPLER": "always_off"})[1] is ALWAYS_OFF
    assert sampler_from_env({"OTEL_TRACES_SAMPLER": "always_on"})[1] is ALWAYS_ON
    env = {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}
    label, sampler = sampler_from_env(env)
    assert label == "parentbased_traceidratio(0.25)"
    assert "0.25" in sampler.get_description()
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER_ARG"):
        sampler_from_env({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"})
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER='jaeger_remote'"):
        sampler_from_env({"OTEL_TRACES_SAMPLER": "jaeger_remote"})


class _Settings:
    otel_endpoint: str | None = None


def test_grpc_without_its_exporter_package_is_a_start_up_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    # As if opentelemetry-exporter-otlp-proto-grpc were not installed.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", None)
    with pytest.raises(ValueError, match="opentelemetry-exporter-otlp-proto-grpc"):
        setup_tracing(_Settings(), FastAPI())


def test_grpc_with_its_exporter_package_uses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
    export = TraceExport("http://127.0.0.1:4317", "grpc", "OTEL_EXPORTER_OTLP_ENDPOINT")
    exporter = export.exporter()
    assert type(exporter).__module__.startswith("opentelemetry.exporter.otlp.proto.grpc")
    exporter.shutdown()
