"""Dashboards: regenerating gives the committed JSON; every shipped PromQL parses."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from gateway.observability.metrics import GatewayMetrics
from gateway.observability.promql import CLASS_INFO, CLASS_LEGEND
from tools.dashboards.build import (
    DASHBOARD_DIR,
    DASHBOARDS,
    all_promql_expressions,
    concrete,
    dashboard_expressions,
    shipped_expressions,
    write_dashboards,
)


def test_regenerating_gives_the_committed_json(tmp_path: Path) -> None:
    for path in write_dashboards(tmp_path):
        committed = DASHBOARD_DIR / path.name
        assert path.read_bytes() == committed.read_bytes(), (
            f"{committed} is stale: run `.venv/bin/python -m tools.dashboards`"
        )
    assert sorted(p.name for p in DASHBOARD_DIR.glob("*.json")) == sorted(DASHBOARDS)


SCOPE = ("namespace", "job", "instance")
#: A metric name in PromQL and the label matchers right after it, if any.
SELECTOR = re.compile(r"(?<![\w:])((?:specgw_|vllm:)[A-Za-z0-9_:]*)(\{[^}]*\})?")


def committed(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((DASHBOARD_DIR / name).read_text())
    return doc


def test_dashboards_have_datasource_scope_and_class_variables() -> None:
    for name in DASHBOARDS:
        doc = committed(name)
        variables = {v["name"]: v for v in doc["templating"]["list"]}
        assert variables["datasource"]["query"] == "prometheus"
        for scope in SCOPE:
            assert variables[scope]["multi"] is True, (name, scope)
            assert variables[scope]["allValue"] == ".*"
            assert variables[scope]["includeAll"] is True
        # Each scope variable lists only what the ones before it allow.
        assert 'namespace=~"$namespace"' in variables["job"]["definition"]
        assert 'job=~"$job"' in variables["instance"]["definition"]
        if name != "specgw-vllm.json":
            assert variables["class"]["multi"] is True
            assert variables["class"]["allValue"] == ".*"
            assert 'instance=~"$instance"' in variables["class"]["definition"]
        ids = [p["id"] for p in doc["panels"]]
        assert len(ids) == len(set(ids))
        for panel in doc["panels"]:
            assert panel["datasource"]["uid"] == "${datasource}"
            for target in panel["targets"]:
                if "rate(" in target["expr"]:
                    window = "$__range" if target["instant"] else "$__rate_interval"
                    assert window in target["expr"], panel["title"]


def test_every_series_in_every_query_carries_namespace_job_and_instance() -> None:
    """Two deployments in one Prometheus are never summed together by a panel."""
    for e in dashboard_expressions():
        selectors = SELECTOR.findall(e.expr)
        assert selectors, e.source
        for metric, matchers in selectors:
            for scope in SCOPE:
                assert f'{scope}=~"${scope}"' in matchers, (e.source, metric)


def test_every_per_class_query_keeps_the_selected_classes_and_shows_their_label(
    metrics: GatewayMetrics,
) -> None:
    """A query over per-class series by class (or over the selected classes) joins
    `specgw_class_info` on `class_id`: the join keeps the classes the `class` variable
    picks by label, and names them. Totals over every class (requests by status) need
    no join."""
    per_class = {
        sample.name
        for family in metrics.registry.collect()
        for sample in family.samples
        if "class_id" in sample.labels and sample.name != "specgw_class_info"
    }
    assert 'label=~"$class"' in CLASS_INFO
    joins = (f"group_left (label) {CLASS_INFO}", f"group_left () {CLASS_INFO}")
    checked = 0
    for e in dashboard_expressions():
        reads = {metric for metric, _ in SELECTOR.findall(e.expr)} & per_class
        if reads and "class_id" in e.expr:
            assert any(join in e.expr for join in joins), e.source
            checked += 1
    assert checked >= 20


def test_vllm_dashboard_reads_vllms_own_series() -> None:
    exprs = "\n".join(
        t["expr"] for p in committed("specgw-vllm.json")["panels"] for t in p["targets"]
    )
    for family in (
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:kv_cache_usage_perc",
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    ):
        assert family in exprs, family
    assert "specgw_" not in exprs


def test_drift_dashboard_sets_drafters_side_by_side_per_class() -> None:
    panels = {p["title"]: p for p in committed("specgw-drift.json")["panels"]}
    panel = panels["Acceptance length by drafter and class, over the time range"]
    (target,) = panel["targets"]
    assert "group_left (drafter) specgw_build_info" in target["expr"]
    assert "sum by (drafter, class_id)" in target["expr"]
    assert "group_left (label) topk by (class_id) (1, specgw_class_info" in target["expr"]
    assert target["legendFormat"] == f"{CLASS_LEGEND} · {{{{drafter}}}}"
    assert target["instant"] is True


def test_drift_dashboard_has_the_main_panels_and_annotations() -> None:
    doc = committed("specgw-drift.json")
    titles = {p["title"] for p in doc["panels"]}
    assert {
        "Acceptance length by class",
        "Speculation depth k by class",
        "Depth profile: acceptance rate by draft position",
        "Fallback (k = 0) share by class",
        "Output tokens/s by class",
        "TPOT p50 by class",
    } <= titles
    names = {a["name"] for a in doc["annotations"]["list"]}
    assert {"k decisions", "drift events"} <= names


def test_every_specgw_family_is_on_a_dashboard_or_rule() -> None:
    """A family the gateway exports but no panel, annotation or rule reads is invisible
    to an operator."""
    registry = CollectorRegistry()
    GatewayMetrics(registry, max_depth=4, flags=("speculation.enabled",))
    families = {family.name for family in registry.collect()}
    assert len(families) >= 20
    shipped = "\n".join(all_promql_expressions())
    unread = sorted(
        name
        for name in families
        if not re.search(rf"\b{re.escape(name)}(_total|_bucket|_info)?\b", shipped)
    )
    assert unread == []


def test_every_ratio_guards_its_denominator() -> None:
    for expr in all_promql_expressions():
        if "\n  / (" in expr or "\n    / (" in expr:
            assert "> 0)" in expr, expr


def test_expression_list_covers_panels_rules_and_annotations() -> None:
    sources = [e.source for e in shipped_expressions()]
    assert any(s.startswith("specgw-drift.json: annotation") for s in sources)
    assert any(s.startswith("rules.yml: Specgw") for s in sources)
    assert any(s.startswith("specgw-serving.json") for s in sources)
    assert len(all_promql_expressions()) == len(sources) >= 40


def test_every_expression_parses_with_promtool(promtool: str, tmp_path: Path) -> None:
    """Each expression, variables expanded as Grafana would, as a recording rule that
    `promtool check rules` parses (a syntax error fails with the expression named)."""
    rules = [
        {"record": f"check:expr_{i}:test", "expr": concrete(e)}
        for i, e in enumerate(all_promql_expressions())
    ]
    path = tmp_path / "exprs.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "exprs", "rules": rules}]}))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
