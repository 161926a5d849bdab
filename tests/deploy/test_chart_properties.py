"""Key properties of the rendered objects: what an operator relies on, value by value."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from gateway.api.ops_routes import router as ops_router
from tests.deploy.chart import (
    CHART_DIR,
    PRODUCTION_VALUES,
    RELEASE,
    REPO_ROOT,
    Rendered,
    env_of,
    gateway_container,
    load_values,
    render,
    sync_module,
)

FULLNAME = f"{RELEASE}-spec-gateway"


@pytest.fixture(scope="module")
def default() -> Rendered:
    return render()


@pytest.fixture(scope="module")
def production() -> Rendered:
    return render(load_values(PRODUCTION_VALUES))


def _pod(rendered: Rendered) -> dict[str, Any]:
    spec: dict[str, Any] = rendered.one("Deployment", FULLNAME)["spec"]["template"]["spec"]
    return spec


def test_probes_target_ready_and_health_with_a_generous_startup(default: Rendered) -> None:
    container = gateway_container(default)
    assert container["startupProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    startup = container["startupProbe"]
    # The first model load and calibration: 30 minutes before the kubelet gives up.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60
    # The port binds at once and /health is green through loads and in-process restarts
    # (gateway/api/ops_routes.py), so liveness needs no head start.
    assert "initialDelaySeconds" not in container["livenessProbe"]
    # The paths are the gateway's own routes.
    served = {getattr(route, "path", None) for route in ops_router.routes}
    assert {"/ready", "/health"} <= served
    assert container["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]


def test_command_line_is_the_decided_cli(default: Rendered) -> None:
    args = gateway_container(default)["args"]
    assert args == [
        "serve",
        "--host",
        "0.0.0.0",
        "--port",
        "8000",
        "--config",
        "/etc/spec-gateway/config.yaml",
    ]


def test_security_context_non_root_read_only_no_capabilities(production: Rendered) -> None:
    for rendered in (render(), production):
        pod = _pod(rendered)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        for container in pod["containers"] + pod.get("initContainers", []):
            ctx = container["securityContext"]
            assert ctx["readOnlyRootFilesystem"] is True
            assert ctx["allowPrivilegeEscalation"] is False
            assert ctx["capabilities"]["drop"] == ["ALL"]
            assert "add" not in ctx["capabilities"]


def test_writable_scratch_and_shared_memory(default: Rendered) -> None:
    pod = _pod(default)
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    mounts = {m["mountPath"]: m["name"] for m in gateway_container(default)["volumeMounts"]}
    assert mounts["/dev/shm"] == "dshm"
    assert "emptyDir" in volumes[mounts["/tmp"]]
    cache = mounts["/var/cache/spec-gateway"]
    assert "emptyDir" in volumes[cache]
    env = env_of(gateway_container(default))
    for var in ("XDG_CACHE_HOME", "HF_HOME", "VLLM_CACHE_ROOT", "TRITON_CACHE_DIR"):
        assert env[var]["value"].startswith("/var/cache/spec-gateway")
    assert env["HOME"]["value"] == "/tmp"


def test_configmaps_are_mounted_as_directories_never_subpath(production: Rendered) -> None:
    for rendered in (render(), production):
        pod = _pod(rendered)
        configmap_volumes = {v["name"] for v in pod["volumes"] if "configMap" in v}
        assert {"flags", "config"} <= configmap_volumes
        for container in pod["containers"]:
            for mount in container["volumeMounts"]:
                if mount["name"] in configmap_volumes:
                    assert "subPath" not in mount, mount
                    assert "subPathExpr" not in mount, mount
        env = env_of(pod["containers"][0])
        flags_mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "flags")
        assert env["SPECGW_FLAGS_DIR"]["value"] == flags_mount["mountPath"]


def test_flags_configmap_holds_the_generated_flags_json(default: Rendered) -> None:
    cm = default.one("ConfigMap", f"{FULLNAME}-flags")
    source = (CHART_DIR / "files" / "flags" / "flags.json").read_text(encoding="utf-8")
    assert cm["data"]["flags.json"] == source.rstrip("\n")
    assert json.loads(cm["data"]["flags.json"])["flags"]
    volumes = {v["name"]: v for v in _pod(default)["volumes"]}
    assert volumes["flags"]["configMap"]["name"] == cm["metadata"]["name"]


def test_existing_flags_configmap_replaces_the_charts() -> None:
    rendered = render({"flags": {"existingConfigMap": "ops-flags"}})
    assert [c["metadata"]["name"] for c in rendered.of_kind("ConfigMap")] == [f"{FULLNAME}-config"]
    volumes = {v["name"]: v for v in _pod(rendered)["volumes"]}
    assert volumes["flags"]["configMap"]["name"] == "ops-flags"


def test_default_resources_and_no_gpu(default: Rendered) -> None:
    resources = gateway_container(default)["resources"]
    assert resources["requests"]["cpu"]
    assert resources["limits"]["memory"]
    assert "nvidia.com/gpu" not in resources["limits"]
    env = env_of(gateway_container(default))
    assert env["SPECGW_ENGINE_KV_CACHE_GIB"]["value"] == "2"
    # The CPU image's embedded model: no model paths are set.
    assert "SPECGW_ENGINE_MODEL" not in env
    assert "SPECGW_ENGINE_DRAFTER" not in env


def test_production_gpus_follow_tensor_parallel_size(production: Rendered) -> None:
    values = load_values(PRODUCTION_VALUES)
    tp = values["engine"]["tensorParallelSize"]
    container = gateway_container(production)
    assert container["resources"]["limits"]["nvidia.com/gpu"] == tp
    assert container["resources"]["requests"]["nvidia.com/gpu"] == tp
    # Memory and /dev/shm are the cuda variant's own sizes (test_chart_gpu.py).
    cuda = load_values(CHART_DIR / "values.yaml")["variantSizing"]["cuda"]
    assert container["resources"]["limits"]["memory"] == cuda["resources"]["limits"]["memory"]
    env = env_of(container)
    assert env["SPECGW_ENGINE_TENSOR_PARALLEL_SIZE"]["value"] == str(tp)
    assert env["SPECGW_ENGINE_GPU_MEMORY_UTILIZATION"]["value"] == "0.9"
    assert json.loads(env["SPECGW_ENGINE_EXTRA_ARGS"]["value"]) == values["engine"]["extraArgs"]
    assert env["SPECGW_ENGINE_MODEL"]["value"] == "/models/Llama-3.1-8B-Instruct"
    assert env["SPECGW_ENGINE_DRAFTER"]["value"] == "/models/EAGLE3.1-LLaMA3.1-Instruct-8B"
    pod = _pod(production)
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["affinity"] == values["affinity"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {
        "claimName": "llama-3.1-8b-eagle31",
        "readOnly": True,
    }
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": cuda["shmSizeLimit"]}
    deployment = production.one("Deployment", FULLNAME)
    assert deployment["spec"]["replicas"] == 3
    assert gateway_container(production)["image"].endswith(":0.1.0-cuda")


def test_production_secrets_and_external_redis_come_from_existing_secrets(
    production: Rendered,
) -> None:
    assert production.of_kind("Secret") == []
    env = env_of(gateway_container(production))
    assert env["SPECGW_API_KEYS"]["valueFrom"]["secretKeyRef"] == {
        "name": "spec-gateway-keys",
        "key": "api-keys",
    }
    assert env["SPECGW_ADMIN_KEYS"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert env["SPECGW_REDIS_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": "spec-gateway-redis",
        "key": "redis-url",
    }
    assert env["SPECGW_OTEL_ENDPOINT"]["value"].startswith("http://otel-collector")
    # No in-chart Redis in production.
    assert not [o for o in production.objects if o["metadata"]["name"].endswith("-redis")]


def test_generated_api_key_secret_stores_the_digest_the_gateway_reads(default: Rendered) -> None:
    secret = default.one("Secret", FULLNAME)["stringData"]
    assert secret["api-key"].startswith("sk-specgw-")
    assert secret["api-keys"] == hashlib.sha256(secret["api-key"].encode()).hexdigest()
    assert "admin-keys" not in secret  # admin API off unless digests are given


def test_given_digests_and_inline_redis_url_land_in_secrets() -> None:
    digest = hashlib.sha256(b"user").hexdigest()
    admin = hashlib.sha256(b"admin").hexdigest()
    rendered = render(
        {
            "auth": {"apiKeyDigests": [digest, "c" * 64], "adminKeyDigests": [admin]},
            "externalRedis": {"url": "redis://:pw@redis.example:6379/0"},
        }
    )
    secret = rendered.one("Secret", FULLNAME)["stringData"]
    assert secret == {"api-keys": f"{digest},{'c' * 64}", "admin-keys": admin}
    url_secret = rendered.one("Secret", f"{FULLNAME}-redis-url")["stringData"]
    assert url_secret == {"redis-url": "redis://:pw@redis.example:6379/0"}
    # The URL (with its password) is never a plain env value.
    env = env_of(gateway_container(rendered))
    assert "value" not in env["SPECGW_REDIS_URL"]


def test_no_store_unless_asked() -> None:
    """No in-chart store by default, and the old Redis subchart is gone."""
    assert not [o for o in render().objects if "valkey" in o["metadata"]["name"]]
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text(encoding="utf-8"))
    assert "dependencies" not in chart
    assert not (CHART_DIR / "charts").exists()


def test_pdb_and_rolling_update_keep_serving_capacity(production: Rendered) -> None:
    pdb = production.one("PodDisruptionBudget", FULLNAME)
    assert pdb["spec"]["maxUnavailable"] == 1
    deployment = production.one("Deployment", FULLNAME)
    assert pdb["spec"]["selector"] == deployment["spec"]["selector"]
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert render({"podDisruptionBudget": {"enabled": False}}).of_kind("PodDisruptionBudget") == []


@pytest.mark.parametrize(
    ("metric", "name"),
    [
        ("queueDepth", "specgw_admission_queue_depth"),
        ("runningRequests", "specgw_running_requests"),
    ],
)
def test_hpa_on_a_gateway_metric(metric: str, name: str) -> None:
    rendered = render({"autoscaling": {"enabled": True, "metric": metric, "maxReplicas": 6}})
    hpa = rendered.one("HorizontalPodAutoscaler", FULLNAME)
    assert hpa["spec"]["scaleTargetRef"]["name"] == FULLNAME
    assert hpa["spec"]["maxReplicas"] == 6
    [spec] = hpa["spec"]["metrics"]
    assert spec["type"] == "Pods"
    assert spec["pods"]["metric"]["name"] == name
    assert spec["pods"]["target"] == {"type": "AverageValue", "averageValue": "4"}
    # The HPA owns the replica count.
    assert "replicas" not in rendered.one("Deployment", FULLNAME)["spec"]


def test_hpa_cpu_fallback() -> None:
    hpa = render({"autoscaling": {"enabled": True, "metric": "cpu"}}).one("HorizontalPodAutoscaler")
    [spec] = hpa["spec"]["metrics"]
    assert spec == {
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 80}},
    }


def test_observability_objects_are_toggled_by_values(default: Rendered) -> None:
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert default.of_kind(kind) == []
    assert not [
        c for c in default.of_kind("ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]
    ]


def test_service_monitor_scrapes_the_http_port(production: Rendered) -> None:
    monitor = production.one("ServiceMonitor", FULLNAME)
    service = production.one("Service", FULLNAME)
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"] == "http"
    assert endpoint["path"] == "/metrics"


def _alerts(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [r for group in spec["groups"] for r in group["rules"] if "alert" in r]


def test_prometheus_rule_spec_is_the_rules_file(production: Rendered, tmp_path: Path) -> None:
    """The rules file, its runbooks made absolute by the sync tool's own rule."""
    rule = production.one("PrometheusRule", FULLNAME)
    base = load_values(PRODUCTION_VALUES)["metrics"]["prometheusRule"]["runbookBaseUrl"]
    text = (CHART_DIR / "files/prometheus/rules.yml").read_text(encoding="utf-8")
    assert rule["spec"] == yaml.safe_load(sync_module().rules_with_runbook_base(text, base))
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (`make system-deps`): rule syntax not checked")
    rendered_rules = tmp_path / "rendered.yml"
    rendered_rules.write_text(yaml.safe_dump(rule["spec"]), encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "rules", str(rendered_rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboards_are_labelled_for_the_grafana_sidecar(production: Rendered) -> None:
    dashboards = [
        c for c in production.of_kind("ConfigMap") if "grafana_dashboard" in c["metadata"]["labels"]
    ]
    sources = sorted((CHART_DIR / "files" / "dashboards").glob("*.json"))
    assert len(dashboards) == len(sources) > 0
    by_file = {next(iter(c["data"])): c for c in dashboards}
    for source in sources:
        cm = by_file[source.name]
        assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
        # Byte-for-byte the dashboard JSON, through the template's quoting and YAML.
        assert cm["data"][source.name] == source.read_text(encoding="utf-8")
        assert json.loads(cm["data"][source.name])["title"]


def test_config_change_rolls_pods_but_flags_do_not() -> None:
    def checksum(values: dict[str, Any]) -> str:
        deployment = render(values).one("Deployment", FULLNAME)
        annotations: dict[str, str] = deployment["spec"]["template"]["metadata"]["annotations"]
        return annotations["checksum/config"]

    base = checksum({})
    assert checksum({"gateway": {"config": {"max_running": 8}}}) != base
    assert checksum({"flags": {"existingConfigMap": "other"}}) == base


def test_gateway_config_file_holds_the_given_settings() -> None:
    rendered = render({"gateway": {"config": {"max_running": 8, "max_queued": 64}}})
    cm = rendered.one("ConfigMap", f"{FULLNAME}-config")
    assert yaml.safe_load(cm["data"]["config.yaml"]) == {"max_running": 8, "max_queued": 64}
    assert (
        yaml.safe_load(render().one("ConfigMap", f"{FULLNAME}-config")["data"]["config.yaml"]) == {}
    )


def test_init_container_fills_a_models_emptydir() -> None:
    rendered = render(
        {
            "image": {"variant": "cuda"},
            "gpu": {"enabled": True},
            "models": {
                "source": "initContainer",
                "initContainer": {
                    "image": {"repository": "ghcr.io/example/fetch", "tag": "1.2.3"},
                    "command": ["fetch", "/models"],
                },
            },
        }
    )
    pod = _pod(rendered)
    [init] = pod["initContainers"]
    assert init["image"] == "ghcr.io/example/fetch:1.2.3"
    assert {"name": "models", "mountPath": "/models"} in init["volumeMounts"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["models"]
    gateway_mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "models")
    assert gateway_mount["readOnly"] is True
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_notes_render_with_instructions(default: Rendered, production: Rendered) -> None:
    notes = default.templates["spec-gateway/templates/NOTES.txt"]
    assert "port-forward" in notes
    assert "jsonpath='{.data.api-key}'" in notes
    assert "WARNING" not in notes
    warned = render({"replicaCount": 2}).templates["spec-gateway/templates/NOTES.txt"]
    assert "no Redis" in warned
    assert "GPU" in production.templates["spec-gateway/templates/NOTES.txt"]


def test_every_runbook_url_is_absolute_under_the_one_base() -> None:
    base = "https://git.example.com/ml/spec-gateway/-/blob/v0.1.0/deploy/runbooks/"
    values = {"metrics": {"prometheusRule": {"enabled": True, "runbookBaseUrl": base}}}
    alerts = _alerts(render(values).one("PrometheusRule")["spec"])
    assert alerts
    for alert in alerts:
        url = alert["annotations"]["runbook_url"]
        assert url.startswith(base), url  # one slash: the base's trailing one is trimmed
        assert (REPO_ROOT / "deploy/runbooks" / url.removeprefix(base)).is_file(), url


def test_the_rule_needs_a_runbook_base() -> None:
    with pytest.raises(helm_python.HelmError) as exc:
        render({"metrics": {"prometheusRule": {"enabled": True}}})
    assert "runbookBaseUrl" in str(exc.value)


def test_the_sync_tool_prints_the_standalone_rules_with_absolute_runbooks(
    capsys: pytest.CaptureFixture[str],
) -> None:
    base = "https://example.org/spec-gateway/deploy/runbooks"
    assert sync_module().main(["--runbook-base-url", base]) == 0
    alerts = _alerts(yaml.safe_load(capsys.readouterr().out))
    assert alerts
    assert all(a["annotations"]["runbook_url"].startswith(base + "/") for a in alerts)
