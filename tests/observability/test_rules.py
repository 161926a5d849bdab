"""Prometheus rules: promtool check + unit tests, and the conventions they follow."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULE_TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml"))


def load_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_promtool_check_rules(promtool: str) -> None:
    result = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass(promtool: str) -> None:
    assert RULE_TESTS
    result = subprocess.run(
        [promtool, "test", "rules", *map(str, RULE_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULES.parent,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_and_a_silent_case() -> None:
    fires: set[str] = set()
    silent: set[str] = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fires if check["exp_alerts"] else silent).add(check["alertname"])
    alerts = {rule["alert"] for rule in load_rules() if "alert" in rule}
    assert len(alerts) == 8
    assert alerts == fires
    assert alerts == silent


def test_naming_conventions() -> None:
    for rule in load_rules():
        if "record" in rule:
            assert rule["record"].count(":") == 2, rule["record"]
        else:
            assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
            assert rule["labels"]["severity"] in {"info", "warning", "critical"}
            assert ":" not in rule["alert"]


def test_every_alert_links_a_runbook_that_exists_and_names_it() -> None:
    for rule in load_rules():
        if "alert" not in rule:
            continue
        url = rule["annotations"]["runbook_url"]
        assert url.startswith("deploy/runbooks/"), url
        assert url.endswith(".md"), url
        runbook = ROOT / url
        assert runbook.is_file(), f"{rule['alert']}: {url} is missing"
        assert rule["alert"] in runbook.read_text(), f"{url} does not name {rule['alert']}"


def test_aggregations_keep_namespace_and_job() -> None:
    """Two deployments in one Prometheus are never summed together by a rule."""
    for rule in load_rules():
        for by in re.findall(r"\b(?:sum|max|min|avg|topk) by \(([^)]*)\)", rule["expr"]):
            labels = {label.strip() for label in by.split(",")}
            assert {"namespace", "job"} <= labels, (rule.get("record") or rule["alert"], by)
