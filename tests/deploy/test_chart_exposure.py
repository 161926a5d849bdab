"""The chart's state store (Valkey), its NetworkPolicies, Ingress, HTTPRoute and helm test.

kubernetes-validate (test_chart_render.py) checks the built-in kinds against the API schemas;
it has no Gateway API schemas, so the HTTPRoute is checked here against the HTTPRoute CRD's
own openAPIV3Schema (vendored in `schemas/httproute-v1.json`) and against HTTPROUTE_V1, a
stricter hand-written subset (the fields the chart renders; unknown fields fail, which the
CRD leaves to the API server's pruning).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from gateway.settings import GatewaySettings
from tests.deploy.chart import RELEASE, Rendered, env_of, gateway_container, render

FULLNAME = f"{RELEASE}-spec-gateway"
VALKEY = f"{FULLNAME}-valkey"
HOST = "llm.example.com"

_DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_DURATION = r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"  # Gateway API's Duration (GEP-2257)
_OBJECT_NAME = {"type": "string", "minLength": 1, "maxLength": 253}
HTTPROUTE_V1: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "gateway.networking.k8s.io/v1"},
        "kind": {"const": "HTTPRoute"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "parentRefs": {
                    "type": "array",
                    "maxItems": 32,
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "group": {"type": "string", "maxLength": 253},
                            "kind": {"type": "string", "minLength": 1, "maxLength": 63},
                            "namespace": {"type": "string", "pattern": _DNS_LABEL, "maxLength": 63},
                            "name": _OBJECT_NAME,
                            "sectionName": _OBJECT_NAME,
                            "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                        },
                    },
                },
                "hostnames": {
                    "type": "array",
                    "maxItems": 16,
                    "items": {
                        "type": "string",
                        "maxLength": 253,
                        "pattern": r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?"
                        r"(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
                    },
                },
                "rules": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": 16,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "matches": {
                                "type": "array",
                                "maxItems": 64,
                                "items": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "properties": {
                                        "path": {
                                            "type": "object",
                                            "additionalProperties": False,
                                            "properties": {
                                                "type": {
                                                    "enum": [
                                                        "Exact",
                                                        "PathPrefix",
                                                        "RegularExpression",
                                                    ]
                                                },
                                                "value": {
                                                    "type": "string",
                                                    "maxLength": 1024,
                                                    "pattern": "^/",
                                                },
                                            },
                                        }
                                    },
                                },
                            },
                            "backendRefs": {
                                "type": "array",
                                "maxItems": 16,
                                "items": {
                                    "type": "object",
                                    # A Service backend must name its port (a CEL rule of the CRD).
                                    "required": ["name", "port"],
                                    "additionalProperties": False,
                                    "properties": {
                                        "name": _OBJECT_NAME,
                                        "namespace": {"type": "string", "pattern": _DNS_LABEL},
                                        "port": {"type": "integer", "minimum": 1, "maximum": 65535},
                                        "weight": {"type": "integer", "minimum": 0},
                                    },
                                },
                            },
                            "timeouts": {
                                "type": "object",
                                "additionalProperties": False,
                                "properties": {
                                    "request": {"type": "string", "pattern": _DURATION},
                                    "backendRequest": {"type": "string", "pattern": _DURATION},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}

NGINX_STREAMING = {
    "nginx.ingress.kubernetes.io/proxy-buffering": "off",
    "nginx.ingress.kubernetes.io/proxy-read-timeout": "3600",
}
EXPOSED: dict[str, Any] = {
    "valkey": {"enabled": True},
    "networkPolicy": {"enabled": True},
    "ingress": {
        "enabled": True,
        "className": "nginx",
        # The chart sets none: each controller spells its own (values.yaml names these).
        "annotations": NGINX_STREAMING,
        "hosts": [{"host": HOST, "paths": [{"path": "/", "pathType": "Prefix"}]}],
        "tls": [{"secretName": "llm-tls", "hosts": [HOST]}],
    },
    "httpRoute": {
        "enabled": True,
        "parentRefs": [{"name": "public", "namespace": "gateway-system", "sectionName": "https"}],
        "hostnames": [HOST],
    },
}


@pytest.fixture(scope="module")
def exposed() -> Rendered:
    return render(EXPOSED)


def _valkey_pod(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = rendered.one("StatefulSet", VALKEY)["spec"]["template"]["spec"]
    return spec


def test_the_store_is_valkey_with_a_generated_password(exposed: Rendered) -> None:
    pod = _valkey_pod(exposed)
    container = pod["containers"][0]
    assert container["image"].startswith("docker.io/valkey/valkey:")
    assert "redis" not in container["image"]
    password = exposed.one("Secret", VALKEY)["stringData"]["password"]
    assert re.fullmatch(r"[A-Za-z0-9]{32}", password)
    secret_ref = {"name": VALKEY, "key": "password"}
    assert env_of(container)["VALKEY_PASSWORD"]["valueFrom"]["secretKeyRef"] == secret_ref
    args = container["args"]
    assert args[args.index("--requirepass") + 1] == "$(VALKEY_PASSWORD)"
    assert "VALKEY_PASSWORD" in container["readinessProbe"]["exec"]["command"][-1]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert password not in str(exposed.one("StatefulSet", VALKEY))


def test_the_gateway_gets_the_password_from_the_secret_never_in_the_url(exposed: Rendered) -> None:
    env = env_of(gateway_container(exposed))
    assert env["SPECGW_REDIS_URL"]["value"] == f"redis://{VALKEY}:6379/0"
    assert env["SPECGW_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": VALKEY,
        "key": "password",
    }


def test_an_existing_password_secret_replaces_the_generated_one() -> None:
    rendered = render(
        {"valkey": {"enabled": True, "auth": {"existingSecret": "vk", "existingSecretKey": "pw"}}}
    )
    assert not [o for o in rendered.of_kind("Secret") if o["metadata"]["name"] == VALKEY]
    ref = env_of(gateway_container(rendered))["SPECGW_REDIS_PASSWORD"]["valueFrom"]
    assert ref["secretKeyRef"] == {"name": "vk", "key": "pw"}


def test_store_is_persistent_by_default_and_ephemeral_on_request(exposed: Rendered) -> None:
    statefulset = exposed.one("StatefulSet", VALKEY)
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "--appendonly" in statefulset["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "volumes" not in statefulset["spec"]["template"]["spec"]
    ephemeral = render({"valkey": {"enabled": True, "persistence": {"enabled": False}}})
    spec = ephemeral.one("StatefulSet", VALKEY)["spec"]
    assert "volumeClaimTemplates" not in spec
    assert spec["template"]["spec"]["volumes"] == [
        {"name": "data", "emptyDir": {"sizeLimit": "1Gi"}}
    ]


def test_only_gateway_pods_reach_the_store(exposed: Rendered) -> None:
    policy = exposed.one("NetworkPolicy", VALKEY)["spec"]
    store_labels = exposed.one("StatefulSet", VALKEY)["spec"]["template"]["metadata"]["labels"]
    gateway_selector = exposed.one("Service", FULLNAME)["spec"]["selector"]
    assert policy["podSelector"]["matchLabels"].items() <= store_labels.items()
    ((rule),) = policy["ingress"]
    assert rule["from"] == [{"podSelector": {"matchLabels": gateway_selector}}]
    assert rule["ports"] == [{"port": "valkey", "protocol": "TCP"}]
    # The gateway's own selectors never pick the store's pods.
    assert not gateway_selector.items() <= store_labels.items()


def test_gateway_network_policy_admits_configured_peers_and_monitoring(exposed: Rendered) -> None:
    assert not render().of_kind("NetworkPolicy")
    default_rule, metrics_rule = exposed.one("NetworkPolicy", FULLNAME)["spec"]["ingress"]
    assert default_rule["from"] == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": RELEASE}}},
        {"podSelector": {}},
    ]
    monitoring = {"kubernetes.io/metadata.name": "monitoring"}
    assert metrics_rule["from"] == [{"namespaceSelector": {"matchLabels": monitoring}}]
    assert metrics_rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    ingress_nginx = {"namespaceSelector": {"matchLabels": {"name": "ingress-nginx"}}}
    custom = render({"networkPolicy": {"enabled": True, "ingressFrom": [ingress_nginx]}})
    rule = custom.one("NetworkPolicy", FULLNAME)["spec"]["ingress"][0]
    assert rule["from"][1:] == [ingress_nginx]


def test_ingress_carries_the_operator_annotations(exposed: Rendered) -> None:
    ingress = exposed.one("Ingress", FULLNAME)
    assert ingress["metadata"]["annotations"] == NGINX_STREAMING
    ((rule),) = ingress["spec"]["rules"]
    assert rule["host"] == HOST
    backend = rule["http"]["paths"][0]["backend"]["service"]
    assert backend == {"name": FULLNAME, "port": {"name": "http"}}
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "llm-tls", "hosts": [HOST]}]


def test_http_route_matches_the_gateway_api_shape(exposed: Rendered) -> None:
    route = exposed.one("HTTPRoute", FULLNAME)
    jsonschema.validate(route, HTTPROUTE_V1)
    ((rule),) = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": FULLNAME, "port": 8000}]
    assert rule["timeouts"] == {"request": "3600s", "backendRequest": "3600s"}
    assert route["spec"]["hostnames"] == [HOST]


@pytest.mark.parametrize(
    ("path", "bad"),
    [
        (("spec", "rules", 0, "timeouts", "request"), "1 hour"),
        (("spec", "rules", 0, "matches", 0, "path", "type"), "Prefix"),
        (("spec", "parentRefs", 0, "gatewayName"), "public"),
    ],
)
def test_the_route_schema_can_fail(exposed: Rendered, path: tuple[Any, ...], bad: str) -> None:
    route = copy.deepcopy(exposed.one("HTTPRoute", FULLNAME))  # the rendering is shared
    node = route
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = bad
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(route, HTTPROUTE_V1)


def test_exposure_objects_are_off_by_default() -> None:
    kinds = render().kinds()
    assert "Ingress" not in kinds
    assert "HTTPRoute" not in kinds
    assert "StatefulSet" not in kinds


def test_external_redis_acl_and_tls_reach_the_gateway_settings() -> None:
    rendered = render(
        {
            "externalRedis": {
                "url": "rediss://redis.example:6380/0",
                "username": "specgw",
                "passwordSecret": "redis-credentials",
                "tls": {"existingSecret": "redis-client-tls", "clientCertificate": True},
            }
        }
    )
    container = gateway_container(rendered)
    env = env_of(container)
    assert env["SPECGW_REDIS_USERNAME"]["value"] == "specgw"
    assert env["SPECGW_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "redis-credentials"
    tls_dir = "/etc/spec-gateway-redis-tls"
    assert env["SPECGW_REDIS_TLS_CA_FILE"]["value"] == f"{tls_dir}/ca.crt"
    assert env["SPECGW_REDIS_TLS_CERT_FILE"]["value"] == f"{tls_dir}/tls.crt"
    assert env["SPECGW_REDIS_TLS_KEY_FILE"]["value"] == f"{tls_dir}/tls.key"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["redis-tls"]["mountPath"] == tls_dir
    pod = rendered.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["redis-tls"]["secret"]["secretName"] == "redis-client-tls"
    # Every SPECGW_REDIS_* the chart sets is a setting the gateway reads.
    fields = set(GatewaySettings.model_fields)
    redis_env = {name for name in env if name.startswith("SPECGW_REDIS")}
    assert {name.removeprefix("SPECGW_").lower() for name in redis_env} <= fields


def test_helm_test_calls_models_with_a_user_key(exposed: Rendered) -> None:
    pod = exposed.one("Pod", f"{FULLNAME}-test-models")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    container = pod["spec"]["containers"][0]
    assert "/v1/models" in container["args"][0]
    ref = env_of(container)["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": FULLNAME, "key": "api-key"}
    # Keys given as digests: the chart knows no plaintext key, so no test unless one is named.
    digests = {"auth": {"apiKeyDigests": ["a" * 64]}}
    assert not render(digests).of_kind("Pod")
    named = render({**digests, "helmTest": {"apiKeySecret": "test-key", "apiKeySecretKey": "k"}})
    container = named.one("Pod")["spec"]["containers"][0]
    assert env_of(container)["OPENAI_API_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": "test-key",
        "key": "k",
    }


def _official_route_schema() -> dict[str, Any]:
    """The HTTPRoute CRD's own openAPIV3Schema (v1), vendored from the Gateway API project."""
    path = Path(__file__).parent / "schemas" / "httproute-v1.json"
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema


def test_http_route_validates_against_the_gateway_api_crd_schema(exposed: Rendered) -> None:
    """The rendered route against the CRD's own OpenAPI document (types, enums, patterns,
    limits; the CRD's CEL rules are the API server's and not checked here)."""
    route = copy.deepcopy(exposed.one("HTTPRoute", FULLNAME))
    schema = _official_route_schema()
    jsonschema.Draft4Validator(schema).validate(route)
    route["spec"]["rules"][0]["matches"][0]["path"]["type"] = "Prefix"  # not in the enum
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft4Validator(schema).validate(route)
