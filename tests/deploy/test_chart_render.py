"""The chart renders, lints and validates against the Kubernetes API schemas, offline.

Rendering and lint run Helm's Go engine in-process (tests/deploy/chart.py); API validation uses
the OpenAPI-derived JSON schemas bundled in kubernetes-validate (strict: unknown fields fail).
ServiceMonitor and PrometheusRule are CRDs of the Prometheus Operator, which kubernetes-validate
does not ship: test_chart_properties.py checks their shape and runs promtool on the rule spec.
"""

from __future__ import annotations

import json
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.deploy.chart import (
    CHART_DIR,
    KUBE_VERSIONS,
    PRODUCTION_VALUES,
    load_values,
    render,
)
from tests.deploy.chart import lint as helm_lint

#: Custom resources kubernetes-validate has no schema for: test_chart_exposure.py checks the
#: HTTPRoute's shape, test_chart_properties.py the Prometheus Operator's,
#: test_chart_extensions.py the InferencePool (against its CRD) and the ScaledObject.
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "HTTPRoute", "InferencePool", "ScaledObject"}

# Value sets every test below renders: the defaults, the production-like file, and the
# branches the defaults and production leave unrendered.
VALUE_SETS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "production": load_values(PRODUCTION_VALUES),
    "in-chart-valkey-hpa-queue": {
        "replicaCount": 2,
        "valkey": {"enabled": True},
        "autoscaling": {"enabled": True, "metric": "queueDepth"},
        "auth": {"apiKeyDigests": ["a" * 64], "adminKeyDigests": ["b" * 64]},
    },
    "hpa-cpu-external-url": {
        "autoscaling": {"enabled": True, "metric": "cpu"},
        "externalRedis": {"url": "redis://:pw@redis.example:6379/0"},
        "gateway": {"config": {"max_running": 64, "max_queued": 256}},
    },
    "exposed-ephemeral-valkey": {
        "valkey": {"enabled": True, "persistence": {"enabled": False}},
        "networkPolicy": {"enabled": True},
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "hosts": [{"host": "llm.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
            "tls": [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}],
        },
        "httpRoute": {
            "enabled": True,
            "parentRefs": [{"name": "public", "namespace": "gateway-system"}],
            "hostnames": ["llm.example.com"],
        },
    },
    "external-redis-acl-tls": {
        "externalRedis": {
            "url": "rediss://redis.example:6380/0",
            "username": "specgw",
            "passwordSecret": "redis-credentials",
            "tls": {"existingSecret": "redis-client-tls", "clientCertificate": True},
        },
        "auth": {"apiKeyDigests": ["a" * 64]},
        "helmTest": {"apiKeySecret": "test-key"},
    },
    "cuda-hub-models-cache-claim": {
        "image": {"variant": "cuda"},
        "gpu": {"enabled": True},
        "engine": {
            "model": "meta-llama/Llama-3.1-8B-Instruct",
            "drafter": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
            "maxModelLen": 32768,
        },
        "models": {"huggingFaceToken": {"existingSecret": "hf-token"}},
        "scratch": {"cacheExistingClaim": "specgw-cache"},
        "resources": {"limits": {"memory": "80Gi"}},
    },
    "init-container-models": {
        "image": {"variant": "cuda"},
        "gpu": {"enabled": True, "count": 4},
        "engine": {
            "tensorParallelSize": 4,
            "maxNumSeqs": 64,
            "enforceEager": False,
            "extraArgs": {"enable_chunked_prefill": True},
        },
        "models": {
            "source": "initContainer",
            "initContainer": {
                "image": {"repository": "ghcr.io/example/model-fetch", "tag": "1.0.0"},
                "command": ["/bin/sh", "-c", "fetch-models $SPECGW_MODELS_DIR"],
            },
        },
        "flags": {"existingConfigMap": "my-flags"},
        "serviceAccount": {"create": False},
    },
    "host-path-pool-keda-extras": {
        "models": {"source": "hostPath", "hostPath": {"path": "/mnt/models"}},
        "engine": {"revision": "main"},
        "scratch": {"cacheEphemeral": {"enabled": True, "size": "120Gi"}},
        "runtimeClassName": "nvidia",
        "extraVolumes": [{"name": "adapters", "persistentVolumeClaim": {"claimName": "lora"}}],
        "extraVolumeMounts": [{"name": "adapters", "mountPath": "/adapters", "readOnly": True}],
        "extraObjects": [
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-x\n"
            '  labels:\n    {{- include "spec-gateway.labels" . | nindent 4 }}\n'
        ],
        "inferencePool": {"enabled": True, "endpointPicker": {"name": "specgw-epp"}},
        "httpRoute": {"enabled": True, "parentRefs": [{"name": "inference-gateway"}]},
        "keda": {"enabled": True, "prometheus": {"serverAddress": "http://prometheus:9090"}},
    },
}


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any] | None]:
    return request.param, VALUE_SETS[request.param]


def test_helm_engine_is_the_real_one() -> None:
    """The renderer is Helm's Go SDK (v4), loaded from the wheel, not a Python imitation."""
    assert helm_python.helm_sdk_version().startswith("v4.")
    assert helm_python.library_path.name.startswith("libhelm_c")


def test_renders_and_validates_against_kubernetes_schemas(
    value_set: tuple[str, dict[str, Any] | None],
) -> None:
    name, values = value_set
    rendered = render(values)
    assert {"Deployment", "Service", "ConfigMap"} <= set(rendered.kinds()), name
    for obj in rendered.objects:
        if obj["kind"] in CRD_KINDS:
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                path = ".".join(str(p) for p in exc.path)
                pytest.fail(f"{name}: {obj['kind']}/{obj['metadata']['name']} @ {path}: {exc}")


def test_validator_catches_a_broken_deployment() -> None:
    """The offline validation can fail: a misspelt container field is rejected (strict)."""
    deployment = render().one("Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {"httpGet": {}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)
    deployment = render().one("Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limitz"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)


def test_lint_strict_is_clean(value_set: tuple[str, dict[str, Any] | None]) -> None:
    name, values = value_set
    report = helm_lint(values)
    assert report["errors"] == [], name
    # Severity 1 = info (e.g. "icon is recommended"); warnings and errors fail strict lint.
    assert [m for m in report["messages"] if m["severity"] >= 2] == [], name


def test_every_rendered_object_carries_the_helm_labels() -> None:
    for values in VALUE_SETS.values():
        for obj in render(values).objects:
            labels = obj["metadata"].get("labels", {})
            assert labels.get("app.kubernetes.io/managed-by") == "Helm", obj["metadata"]["name"]
            assert "app.kubernetes.io/instance" in labels


def test_schema_accepts_the_defaults_and_the_production_values() -> None:
    with helm_python.Chart.load(CHART_DIR) as chart:
        chart.validate_schema(None)
        chart.validate_schema(load_values(PRODUCTION_VALUES))


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ({"image": {"variant": "rocm"}}, "variant"),
        ({"engine": {"tensorParallelSize": 0}}, "tensorParallelSize"),
        ({"auth": {"apiKeyDigests": ["not-a-digest"]}}, "apiKeyDigests"),
        ({"autoscaling": {"metric": "latency"}}, "metric"),
        ({"flags": {"mountPath": "relative/dir"}}, "mountPath"),
        ({"replicas": 3}, "replicas"),  # a misspelt top-level key
        ({"redis": {"enabled": True}}, "redis"),  # the old in-chart Redis: now `valkey`
        ({"httpRoute": {"timeouts": {"request": "an hour"}}}, "request"),
        ({"valkey": {"persistence": {"accessModes": []}}}, "accessModes"),
    ],
)
def test_schema_rejects_bad_values(bad: dict[str, Any], needle: str) -> None:
    with (
        helm_python.Chart.load(CHART_DIR) as chart,
        pytest.raises(helm_python.HelmValuesError) as exc,
    ):
        chart.validate_schema(bad)
    assert needle in str(exc.value)


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        ({"image": {"variant": "cuda"}}, "no embedded model"),
        ({"models": {"source": "pvc"}}, "existingClaim"),
        ({"valkey": {"enabled": True}, "externalRedis": {"url": "redis://r:6379"}}, "not both"),
        ({"httpRoute": {"enabled": True}}, "parentRefs"),
        ({"ingress": {"enabled": True}}, "ingress.hosts"),
        (
            {"externalRedis": {"url": "redis://r:6379", "tls": {"existingSecret": "ca"}}},
            "rediss://",
        ),
    ],
)
def test_render_refuses_contradictory_values(bad: dict[str, Any], needle: str) -> None:
    with pytest.raises(helm_python.HelmError) as exc:
        render(bad)
    assert needle in str(exc.value)


def _leaf_paths(node: Any, prefix: str = "") -> set[str]:
    """Dotted paths of values.yaml down to where the schema stops naming properties."""
    if isinstance(node, dict) and node:
        paths = {prefix} if prefix else set()
        for key, child in node.items():
            paths |= _leaf_paths(child, f"{prefix}.{key}" if prefix else key)
        return paths
    return {prefix}


def _schema_paths(schema: dict[str, Any], prefix: str = "") -> tuple[set[str], set[str]]:
    """(paths the schema names, paths under which it allows free-form keys)."""
    named: set[str] = {prefix} if prefix else set()
    free: set[str] = set()
    props = schema.get("properties")
    if props is None or schema.get("additionalProperties") is not False:
        free.add(prefix)
    for key, sub in (props or {}).items():
        path = f"{prefix}.{key}" if prefix else key
        sub_named, sub_free = _schema_paths(sub, path)
        named |= sub_named
        free |= sub_free
    return named, free


def test_values_schema_in_step_with_values_yaml() -> None:
    """Every key of values.yaml is in the schema; every schema property has a default."""
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text(encoding="utf-8"))
    schema = json.loads((CHART_DIR / "values.schema.json").read_text(encoding="utf-8"))
    named, free = _schema_paths(schema)
    in_values = _leaf_paths(values)

    def covered(path: str) -> bool:
        parts = path.split(".")
        return path in named or any(".".join(parts[:i]) in free for i in range(1, len(parts)))

    assert sorted(p for p in in_values if not covered(p)) == []
    # The other direction: schema properties without a default in values.yaml. `global` is
    # Helm's; minAvailable is the documented alternative to maxUnavailable.
    optional = {"global", "podDisruptionBudget.minAvailable"}
    probe_extras = {"initialDelaySeconds", "successThreshold"}
    missing = sorted(
        p
        for p in named - in_values - optional
        if not any(p.startswith(f"{v}.") for v in in_values if v in free)
        and p.rsplit(".", 1)[-1] not in probe_extras
        and p not in ("resources.claims", "valkey.resources.claims")
        # The settings file's keys: their defaults are the gateway's (test_chart_config.py).
        and not p.startswith("gateway.config.")
    )
    assert missing == []
