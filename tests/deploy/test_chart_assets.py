"""The chart's rules, dashboards and flags are byte copies of their sources.

Sources: deploy/prometheus/rules.yml, grafana/dashboards/*.json, and the flags document
generated from gateway.flags. `python deploy/sync_chart_assets.py` refreshes the copies.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from tests.deploy.chart import CHART_DIR, REPO_ROOT, sync_module


@pytest.fixture(scope="module")
def sync() -> ModuleType:
    return sync_module()


def test_rules_in_chart_are_byte_identical() -> None:
    source = REPO_ROOT / "deploy" / "prometheus" / "rules.yml"
    assert source.is_file(), "deploy/prometheus/rules.yml is the source of the PrometheusRule"
    assert (CHART_DIR / "files" / "prometheus" / "rules.yml").read_bytes() == source.read_bytes()


def test_dashboards_in_chart_are_byte_identical() -> None:
    sources = {
        p.name: p.read_bytes() for p in (REPO_ROOT / "grafana" / "dashboards").glob("*.json")
    }
    copies = {p.name: p.read_bytes() for p in (CHART_DIR / "files" / "dashboards").glob("*.json")}
    assert sources, "grafana/dashboards/ holds the dashboards"
    assert sorted(copies) == sorted(sources)
    for name, data in sources.items():
        assert copies[name] == data, name


def test_flags_in_chart_match_the_code_defaults(sync: ModuleType) -> None:
    assert (CHART_DIR / "files" / "flags" / "flags.json").read_bytes() == sync.flags_json()


def test_sync_check_reports_nothing_stale(sync: ModuleType) -> None:
    assert sync.stale_paths() == []


def test_sync_detects_and_repairs_drift(sync: ModuleType, tmp_path: Path) -> None:
    """On a copy of the layout: an edited copy, a missing one and an orphan are all found."""
    root = tmp_path / "repo"
    for rel in ("deploy/prometheus/rules.yml", "grafana/dashboards/a.json"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / "deploy/prometheus/rules.yml").write_bytes(b"groups: []\n")
    (root / "grafana/dashboards/a.json").write_bytes(b'{"title": "a"}\n')
    assert len(sync.sync(root)) == 3  # flags, rules, one dashboard
    assert sync.stale_paths(root) == []

    files = root / "helm/spec-gateway/files"
    (files / "prometheus/rules.yml").write_bytes(b"groups: [edited]\n")
    (files / "dashboards/a.json").unlink()
    (files / "dashboards/orphan.json").write_bytes(b"{}")
    assert sorted(p.name for p in sync.stale_paths(root)) == ["a.json", "orphan.json", "rules.yml"]
    sync.sync(root)
    assert sync.stale_paths(root) == []
    assert not (files / "dashboards/orphan.json").exists()
    assert (files / "prometheus/rules.yml").read_bytes() == b"groups: []\n"
