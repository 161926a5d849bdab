"""The chart's ways in and out of the cluster's ecosystem: an InferencePool for the Gateway
API Inference Extension, a KEDA ScaledObject, extra objects and volumes, and model sources.

The InferencePool is validated against the v1 CRD's own openAPIV3Schema, vendored from
kubernetes-sigs/gateway-api-inference-extension in `schemas/inferencepool-v1.json` (types,
enums, patterns, limits; the CRD's CEL rules are the API server's and are checked here by
hand where the chart could break one). The Deployment's new fields are checked against the
Kubernetes API schemas by test_chart_render.py's value sets.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import helm_python
import jsonschema
import pytest
import yaml

from tests.deploy.chart import RELEASE, Rendered, gateway_container, render

FULLNAME = f"{RELEASE}-spec-gateway"
SCHEMAS = Path(__file__).parent / "schemas"
POOL = {"inferencePool": {"enabled": True, "endpointPicker": {"name": "specgw-epp"}}}
ROUTE = {"httpRoute": {"enabled": True, "parentRefs": [{"name": "inference-gateway"}]}}
KEDA = {"keda": {"enabled": True, "prometheus": {"serverAddress": "http://prometheus:9090"}}}


def _schema(name: str) -> dict[str, Any]:
    schema: dict[str, Any] = json.loads((SCHEMAS / name).read_text(encoding="utf-8"))
    return schema


def _refused(values: dict[str, Any]) -> str:
    with pytest.raises(helm_python.HelmError) as exc:
        render(values)
    return str(exc.value)


@pytest.fixture(scope="module")
def pooled() -> Rendered:
    return render({**POOL, **ROUTE})


def test_inference_pool_validates_against_the_crd_schema(pooled: Rendered) -> None:
    pool = copy.deepcopy(pooled.one("InferencePool", FULLNAME))
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    validator = jsonschema.Draft4Validator(_schema("inferencepool-v1.json"))
    validator.validate(pool)
    # CEL rule of endpointPickerRef: a Service reference needs a port.
    assert "port" in pool["spec"]["endpointPickerRef"]
    # The validation can fail: a failure mode outside the CRD's enum.
    pool["spec"]["endpointPickerRef"]["failureMode"] = "FailSometimes"
    with pytest.raises(jsonschema.ValidationError):
        validator.validate(pool)


def test_inference_pool_selects_the_gateway_pods_and_nothing_else(pooled: Rendered) -> None:
    selector = pooled.one("InferencePool")["spec"]["selector"]["matchLabels"]
    pod = pooled.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod.items()
    others = pooled.of_kind("Pod") + pooled.of_kind("StatefulSet")
    for other in others:
        labels = other["metadata"]["labels"]
        assert not selector.items() <= labels.items(), other["metadata"]["name"]
    [port] = pooled.one("InferencePool")["spec"]["targetPorts"]
    assert port["number"] == gateway_container(pooled)["ports"][0]["containerPort"]


def test_the_route_sends_to_the_pool_when_there_is_one(pooled: Rendered) -> None:
    route = pooled.one("HTTPRoute")
    [backend] = route["spec"]["rules"][0]["backendRefs"]
    assert backend == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": FULLNAME,
    }
    jsonschema.Draft4Validator(_schema("httproute-v1.json")).validate(route)
    [backend] = render(ROUTE).one("HTTPRoute")["spec"]["rules"][0]["backendRefs"]
    assert backend == {"name": FULLNAME, "port": 8000}


def test_inference_pool_needs_its_endpoint_picker() -> None:
    assert "inferencePool.endpointPicker.name" in _refused({"inferencePool": {"enabled": True}})
    assert not render().of_kind("InferencePool")


def test_keda_scales_on_the_release_queue_series() -> None:
    rendered = render(KEDA)
    scaled = rendered.one("ScaledObject", FULLNAME)
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": FULLNAME,
    }
    [trigger] = spec["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "AverageValue"
    query = trigger["metadata"]["query"]
    # The series the HPA uses, summed over this release's pods (the ServiceMonitor's job).
    assert query == f'sum(specgw_admission_queue_depth{{namespace="llm", job="{FULLNAME}"}})'
    assert trigger["metadata"]["threshold"] == "4"
    assert trigger["metadata"]["serverAddress"] == "http://prometheus:9090"
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]
    # KEDA owns the replica count, as the HPA does.
    assert "replicas" not in rendered.one("Deployment")["spec"]
    assert not rendered.of_kind("HorizontalPodAutoscaler")
    running = {**KEDA, "autoscaling": {"metric": "runningRequests"}}
    [trigger] = render(running).one("ScaledObject")["spec"]["triggers"]
    assert trigger["metadata"]["query"].startswith("sum(specgw_running_requests{")


def test_keda_and_the_hpa_are_exclusive() -> None:
    both = {**KEDA, "autoscaling": {"enabled": True}}
    assert "not both" in _refused(both)
    assert "queueDepth" in _refused({**KEDA, "autoscaling": {"metric": "cpu"}})
    assert "serverAddress" in _refused({"keda": {"enabled": True}})
    # Scale to zero is KEDA's: an HPA's minReplicas stays at least 1.
    assert "keda.enabled" in _refused({"autoscaling": {"enabled": True, "minReplicas": 0}})
    zero = render({**KEDA, "autoscaling": {"minReplicas": 0}}).one("ScaledObject")
    assert zero["spec"]["minReplicaCount"] == 0


def test_extra_objects_go_through_tpl() -> None:
    as_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "{{ .Release.Name }}-a"},
    }
    as_text = (
        "apiVersion: v1\nkind: ConfigMap\n"
        'metadata:\n  name: {{ include "spec-gateway.fullname" . }}-b\n'
    )
    rendered = render({"extraObjects": [as_map, as_text]})
    rendered.one("ConfigMap", f"{RELEASE}-a")
    rendered.one("ConfigMap", f"{FULLNAME}-b")


def test_extra_volumes_runtime_class_and_gpu_placement() -> None:
    values: dict[str, Any] = {
        "runtimeClassName": "nvidia",
        "extraVolumes": [{"name": "adapters", "persistentVolumeClaim": {"claimName": "lora"}}],
        "extraVolumeMounts": [{"name": "adapters", "mountPath": "/adapters", "readOnly": True}],
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    rendered = render(values)
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert values["extraVolumes"][0] in pod["volumes"]
    assert values["extraVolumeMounts"][0] in gateway_container(rendered)["volumeMounts"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert "runtimeClassName" not in render().one("Deployment")["spec"]["template"]["spec"]


def test_ingress_carries_no_controller_annotations_by_default() -> None:
    ingress = {
        "enabled": True,
        "hosts": [{"host": "llm.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
    }
    assert "annotations" not in render({"ingress": ingress}).one("Ingress")["metadata"]


def _models(rendered: Rendered) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    volume = next((v for v in pod["volumes"] if v["name"] == "models"), None)
    mount = next(
        (m for m in gateway_container(rendered)["volumeMounts"] if m["name"] == "models"), None
    )
    return volume, mount


def _env(rendered: Rendered, name: str) -> str | None:
    for entry in gateway_container(rendered)["env"]:
        if entry["name"] == name:
            value: str = entry["value"]
            return value
    return None


def test_a_host_path_source_mounts_the_node_directory_read_only() -> None:
    rendered = render({"models": {"source": "hostPath", "hostPath": {"path": "/mnt/models"}}})
    volume, mount = _models(rendered)
    assert volume == {"name": "models", "hostPath": {"path": "/mnt/models", "type": "Directory"}}
    assert mount is not None
    assert mount["readOnly"] is True
    assert _env(rendered, "SPECGW_ENGINE_MODEL") == "/models/target"
    assert _env(rendered, "SPECGW_ENGINE_DRAFTER") == "/models/drafter"
    assert "hostPath.path" in _refused({"models": {"source": "hostPath"}})


def test_an_image_source_names_directories_inside_the_image() -> None:
    engine = {"model": "/opt/models/target", "drafter": "/opt/models/drafter"}
    rendered = render(
        {"image": {"variant": "cuda"}, "models": {"source": "image"}, "engine": engine}
    )
    assert _models(rendered) == (None, None)
    assert _env(rendered, "SPECGW_ENGINE_MODEL") == "/opt/models/target"
    assert "engine.drafter" in _refused({"models": {"source": "image"}, "engine": {"model": "/m"}})


def test_a_hugging_face_source_pins_a_revision_on_an_ephemeral_cache() -> None:
    values = {
        "engine": {"model": "meta-llama/Llama-3.1-8B-Instruct", "revision": "0e9e39f"},
        "models": {"huggingFaceToken": {"existingSecret": "hf-token"}},
        "scratch": {"cacheEphemeral": {"enabled": True, "size": "120Gi", "storageClass": "fast"}},
    }
    rendered = render(values)
    assert json.loads(_env(rendered, "SPECGW_ENGINE_EXTRA_ARGS") or "{}") == {"revision": "0e9e39f"}
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    [cache] = [v for v in pod["volumes"] if v["name"] == "cache"]
    claim = cache["ephemeral"]["volumeClaimTemplate"]["spec"]
    assert claim["resources"]["requests"]["storage"] == "120Gi"
    assert claim["storageClassName"] == "fast"
    token = next(e for e in gateway_container(rendered)["env"] if e["name"] == "HF_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "hf-token", "key": "token"}
    assert "engine.revision" in _refused({"engine": {"extraArgs": {"revision": "main"}}})
    both = {"scratch": {"cacheExistingClaim": "c", "cacheEphemeral": {"enabled": True}}}
    assert "not both" in _refused(both)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that refuses a repeated mapping key, as the API server's decoder does."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        repeated = {k for k in keys if keys.count(k) > 1}
        assert not repeated, f"repeated keys {repeated} at {node.start_mark}"
        return super().construct_mapping(node, deep=deep)


def test_no_template_repeats_a_key(pooled: Rendered) -> None:
    for path, text in pooled.templates.items():
        if path.endswith((".yaml", ".yml")):
            list(yaml.load_all(text, Loader=_UniqueKeyLoader))


def test_the_service_leaves_the_test_pod_out(pooled: Rendered) -> None:
    selector = pooled.one("Service", FULLNAME)["spec"]["selector"]
    pod = pooled.one("Pod")["metadata"]["labels"]
    assert pod["app.kubernetes.io/component"] == "test"
    assert not selector.items() <= pod.items()
    gateway = pooled.one("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= gateway.items()
