"""The settings `spec-gateway serve` resolves inside the chart's production pod.

The chart (helm/spec-gateway, values ci/production-values.yaml) is rendered with Helm's
own engine (tests/deploy/chart.py); the gateway container's command, environment and
mounts are then replayed here: every mount is a directory under `root` holding what the
pod would see there (the ConfigMaps' files; on the model volume, the Llama-3.1-8B-shaped
target and EAGLE-3 head of tests/cuda/llama31.py under the chart's directory names), each
`SPECGW_*` variable is set with its paths moved onto those directories, and the
container's arguments go through `spec-gateway serve` itself (`gateway.cli.app`).

Stood in: the Secrets the pod reads keys and the Redis URL from (`SECRETS`), and
whatever the pod reaches over the network: `external_services=False` leaves out the
Redis URL and the OpenTelemetry endpoint, for a gateway that must start here.
Variables that are not settings (HOME, the caches' directories) are not set: they
point vLLM and torch at the pod's cache volume.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gateway.auth import digest
from gateway.config import ServeSettings
from tests.cuda.llama31 import LlamaPair, build_llama31_pair
from tests.deploy.chart import PRODUCTION_VALUES, Rendered, gateway_container, load_values, render

USER_KEY = "sk-production-user"
ADMIN_KEY = "sk-production-admin"
#: Secret key -> the value a stand-in Secret holds.
SECRETS = {
    "api-keys": digest(USER_KEY),
    "admin-keys": digest(ADMIN_KEY),
    "redis-url": "redis://redis.production.test:6379/0",
}
#: Settings whose value the pod reaches over the network.
EXTERNAL = ("SPECGW_REDIS_URL", "SPECGW_OTEL_ENDPOINT")
GPU_RESOURCE = "nvidia.com/gpu"


@dataclass(frozen=True)
class ProductionPod:
    """What the gateway container of one replica is given, replayed under a directory."""

    settings: ServeSettings
    environ: dict[str, str]
    args: list[str]
    #: GPUs the container requests (the platform stand-in answers for as many).
    gpus: int
    models: LlamaPair
    values: dict[str, Any]


def _volumes(rendered: Rendered) -> dict[str, dict[str, Any]]:
    pod = rendered.one("Deployment")["spec"]["template"]["spec"]
    return {v["name"]: v for v in pod["volumes"]}


def _mount_points(
    rendered: Rendered, root: Path, values: dict[str, Any]
) -> tuple[dict[str, Path], LlamaPair]:
    """Pod path -> directory under `root`, each filled as the pod's volume would be."""
    container = gateway_container(rendered)
    volumes = _volumes(rendered)
    moved: dict[str, Path] = {}
    pair: LlamaPair | None = None
    for mount in container["volumeMounts"]:
        volume = volumes[mount["name"]]
        local = root / "pod" / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        moved[mount["mountPath"]] = local
        if "configMap" in volume:
            data = rendered.one("ConfigMap", volume["configMap"]["name"]).get("data", {})
            for name, text in data.items():
                (local / name).write_text(text, encoding="utf-8")
        if mount["name"] == "models":
            models = values["models"]
            pair = build_llama31_pair(local, models["targetDir"], models["drafterDir"])
    assert pair is not None, "the production values mount a model volume"
    return moved, pair


def _moved(value: str, mounts: dict[str, Path]) -> str:
    for pod_path, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
        if value == pod_path or value.startswith(pod_path.rstrip("/") + "/"):
            return str(local) + value[len(pod_path.rstrip("/")) :]
    return value


def _environ(container: dict[str, Any], mounts: dict[str, Path]) -> dict[str, str]:
    environ: dict[str, str] = {}
    for entry in container["env"]:
        name = entry["name"]
        if not name.startswith("SPECGW_"):
            continue
        if "value" in entry:
            environ[name] = _moved(str(entry["value"]), mounts)
        else:
            environ[name] = SECRETS[entry["valueFrom"]["secretKeyRef"]["key"]]
    return environ


def production_pod(
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    external_services: bool = True,
    extra_env: Mapping[str, str] | None = None,
) -> ProductionPod:
    """Render the chart, replay its gateway container under `root`, resolve its settings.

    `extra_env`: set as an operator would, through the chart's `gateway.extraEnv`.
    """
    values = load_values(PRODUCTION_VALUES)
    if extra_env:
        gateway = values.setdefault("gateway", {})
        added = [{"name": k, "value": v} for k, v in extra_env.items()]
        gateway["extraEnv"] = [*gateway.get("extraEnv", []), *added]
    rendered = render(values)
    container = gateway_container(rendered)
    mounts, pair = _mount_points(rendered, root, values)
    environ = _environ(container, mounts)
    if not external_services:
        environ = {k: v for k, v in environ.items() if k not in EXTERNAL}
    args = [_moved(a, mounts) for a in container["args"]]
    gpus = int(container["resources"]["limits"].get(GPU_RESOURCE, 0))
    return ProductionPod(
        settings=serve_settings(args, environ, monkeypatch),
        environ=environ,
        args=args,
        gpus=gpus,
        models=pair,
        values=values,
    )


def serve_settings(
    args: list[str], environ: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> ServeSettings:
    """The settings `spec-gateway <args>` starts with in `environ` and nothing else of
    the test process's `SPECGW_*`: the command runs to where it would start serving."""
    import os

    import gateway.cli

    for name in [n for n in os.environ if n.startswith("SPECGW_")]:
        monkeypatch.delenv(name)
    started: list[ServeSettings] = []
    with monkeypatch.context() as patch:
        patch.setattr(gateway.cli, "_run", started.append)
        result = CliRunner().invoke(gateway.cli.app, args, env=environ, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert len(started) == 1, result.output
    return started[0]
