"""Render the Helm chart offline with Helm's own Go engine (helm-python-sdk's libhelm_c).

helm-python-sdk binds Helm v4's Go SDK through ctypes, so `Chart.render` and `lint` run the
same template engine, value coalescing, subchart conditions and schema checks as the helm
binary, with no binary, cluster or network. `lookup` returns nothing offline, as in
`helm template`.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import helm_python
import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "helm" / "spec-gateway"
PRODUCTION_VALUES = CHART_DIR / "ci" / "production-values.yaml"
RELEASE = "specgw"
NAMESPACE = "llm"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest bundled
# with kubernetes-validate.
KUBE_VERSIONS = ("1.27.0", "1.37.0")


@dataclass(frozen=True)
class Rendered:
    """One render: the objects by (kind, name) and the raw text of every template."""

    objects: list[dict[str, Any]]
    templates: dict[str, str]

    def one(self, kind: str, name: str | None = None) -> dict[str, Any]:
        found = [
            o
            for o in self.objects
            if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
        ]
        assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
        return found[0]

    def kinds(self) -> list[str]:
        return sorted(o["kind"] for o in self.objects)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]


def load_values(path: Path) -> dict[str, Any]:
    loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict)
    return loaded


def render(values: dict[str, Any] | None = None) -> Rendered:
    """Render as `helm template specgw helm/spec-gateway -n llm -f values` would."""
    with helm_python.Chart.load(CHART_DIR) as chart:
        templates = chart.render(values=values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: list[dict[str, Any]] = []
    for path, text in sorted(templates.items()):
        if not path.endswith((".yaml", ".yml")):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return Rendered(objects=objects, templates=templates)


def lint(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """`helm lint --strict` (warnings count as errors) with the chart's subcharts."""
    report: dict[str, Any] = helm_python.lint(CHART_DIR, values, strict=True, with_subcharts=True)
    return report


def gateway_container(rendered: Rendered) -> dict[str, Any]:
    pod = rendered.one("Deployment", f"{RELEASE}-spec-gateway")["spec"]["template"]["spec"]
    containers: list[dict[str, Any]] = [c for c in pod["containers"] if c["name"] == "gateway"]
    assert len(containers) == 1
    return containers[0]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


def sync_module() -> ModuleType:
    """deploy/sync_chart_assets.py, a script outside any package, imported by path."""
    spec = importlib.util.spec_from_file_location(
        "sync_chart_assets", REPO_ROOT / "deploy" / "sync_chart_assets.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("sync_chart_assets", module)
    spec.loader.exec_module(module)
    return module
