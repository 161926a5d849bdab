"""deploy/compose.yaml validates against the Compose Specification schema, offline.

The schema is the compose-spec JSON schema vendored in the check-jsonschema wheel
(`check_jsonschema/builtin_schemas/vendor/compose-spec.json`), read from the installed package.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.chart import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "compose.yaml"
PINNED_IMAGE = re.compile(r"^[^:@\s]+:(?!latest$)[A-Za-z0-9][A-Za-z0-9._-]*$")


@pytest.fixture(scope="module")
def compose_schema() -> dict[str, Any]:
    ref = resources.files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json"
    schema: dict[str, Any] = json.loads(ref.read_text(encoding="utf-8"))
    assert schema["title"] == "Compose Specification"
    return schema


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    return loaded


def _validate(document: dict[str, Any], schema: dict[str, Any]) -> None:
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    validator_cls(schema, format_checker=validator_cls.FORMAT_CHECKER).validate(document)


def test_compose_file_validates(compose: dict[str, Any], compose_schema: dict[str, Any]) -> None:
    _validate(compose, compose_schema)
    assert set(compose["services"]) == {"gateway", "redis", "prometheus", "grafana"}


def test_schema_rejects_a_broken_compose_file(
    compose: dict[str, Any], compose_schema: dict[str, Any]
) -> None:
    broken = json.loads(json.dumps(compose))
    broken["services"]["gateway"]["prots"] = ["8000:8000"]
    with pytest.raises(jsonschema.ValidationError):
        _validate(broken, compose_schema)


def _bind_mounts(service: dict[str, Any]) -> list[tuple[Path, str]]:
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, dict) and volume["type"] == "bind":
            mounts.append(((DEPLOY / volume["source"]).resolve(), volume["target"]))
    return mounts


def test_bind_mounts_point_at_files_in_the_repository(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for source, _target in _bind_mounts(service):
            assert source.exists(), f"{name}: {source} is missing"
            assert REPO_ROOT in source.parents


def test_images_are_pinned(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        assert PINNED_IMAGE.match(service["image"]), f"{name}: {service['image']}"


def test_gateway_is_hardened_and_keys_come_from_the_environment(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["gateway"]
    assert gateway["build"]["dockerfile"] == "deploy/docker/Dockerfile.cpu"
    assert gateway["read_only"] is True
    assert gateway["cap_drop"] == ["ALL"]
    assert gateway["user"].split(":")[0] not in {"0", "root"}
    assert "no-new-privileges:true" in gateway["security_opt"]
    env = gateway["environment"]
    # `${VAR:?...}`: compose refuses to start without keys; nothing secret is in the file.
    assert env["SPECGW_API_KEYS"].startswith("${SPECGW_API_KEYS:?")
    assert env["SPECGW_REDIS_URL"] == "redis://redis:6379/0"
    assert "redis" in gateway["depends_on"]
    assert "/ready" in " ".join(gateway["healthcheck"]["test"])


def test_gateway_mounts_the_flags_directory_whole(compose: dict[str, Any]) -> None:
    gateway = compose["services"]["gateway"]
    mounts = dict(_bind_mounts(gateway))
    flags_dir = (REPO_ROOT / "helm/spec-gateway/files/flags").resolve()
    assert mounts[flags_dir] == gateway["environment"]["SPECGW_FLAGS_DIR"]
    assert flags_dir.is_dir()
    assert (flags_dir / "flags.json").is_file()


def test_prometheus_loads_the_rules_and_scrapes_the_gateway(
    compose: dict[str, Any], tmp_path: Path
) -> None:
    prometheus = compose["services"]["prometheus"]
    mounts = {target: source for source, target in _bind_mounts(prometheus)}
    config_path = mounts["/etc/prometheus/prometheus.yml"]
    config = yaml.safe_load(config_path.read_text(encoding="utf-8"))
    [rule_file] = config["rule_files"]
    rules_dir, rules_name = rule_file.rsplit("/", 1)
    assert mounts[rules_dir] == (DEPLOY / "prometheus").resolve()
    assert (mounts[rules_dir] / rules_name).is_file()
    [job] = config["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["gateway:8000"]
    assert job["metrics_path"] == "/metrics"

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool not installed (`make system-deps`): config syntax not checked")
    # promtool resolves rule_files on the host, not in the container: point it at the
    # repository's copy.
    local = dict(config, rule_files=[str(mounts[rules_dir] / rules_name)])
    checked = tmp_path / "prometheus.yml"
    checked.write_text(yaml.safe_dump(local), encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "config", str(checked)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_grafana_is_provisioned_with_the_dashboards(compose: dict[str, Any]) -> None:
    grafana = compose["services"]["grafana"]
    mounts = {target: source for source, target in _bind_mounts(grafana)}
    dashboards_target = grafana["environment"]["SPECGW_DASHBOARDS"]
    assert mounts[dashboards_target] == (REPO_ROOT / "grafana/dashboards").resolve()
    provisioning = grafana["environment"]["GF_PATHS_PROVISIONING"]
    provider_dir = mounts[f"{provisioning}/dashboards"]
    provider = yaml.safe_load(next(provider_dir.glob("*.yml")).read_text(encoding="utf-8"))
    assert provider["providers"][0]["options"]["path"] == "${SPECGW_DASHBOARDS}"
    datasource_dir = mounts[f"{provisioning}/datasources"]
    [datasource] = yaml.safe_load(next(datasource_dir.glob("*.yml")).read_text(encoding="utf-8"))[
        "datasources"
    ]
    assert datasource["url"] == "http://prometheus:9090"
    assert datasource["type"] == "prometheus"
