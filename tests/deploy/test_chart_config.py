"""The chart refuses what the gateway would refuse in `gateway.config`, before any pod runs.

`values.schema.json` holds, at `gateway.config`, the JSON schema generated from the
gateway's settings model (`gateway.config.chart_schema`, written by
`deploy/sync_chart_assets.py`); Helm's own validator (tests/deploy/chart.py) applies it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from gateway.config import ConfigError, chart_schema, resolve
from tests.deploy.chart import CHART_DIR, RELEASE, render
from tests.deploy.chart import lint as helm_lint

GOOD = {
    "max_running": 8,
    "queue_timeout_s": 12.5,
    "control": {"hysteresis": 0.2, "calibrate_batches": [1, 2]},
    "flags": {"op_timeout_s": 0.3},
    "state": {"flush_interval_s": 1.0},
    "tenants": {"default": {"requests_per_minute": 600}, "replicas": 3},
    "engine": {"spec_tokens_per_batch_size": [[1, 4, 3]]},
}
BAD = [
    ({"max_runing": 4}, "max_runing"),
    ({"engine": {"max_depht": 2}}, "max_depht"),
    ({"control": {"hysteresys": 0.2}}, "hysteresys"),
    ({"tenants": {"default": {"wieght": 2}}}, "wieght"),
    ({"flags": {"namespace": "x"}}, "namespace"),  # a top-level key, not the section's
    ({"config_file": "/etc/x.yaml"}, "config_file"),  # names the file, not a key of it
    ({"max_running": 0}, "max_running"),
    ({"control": {"cold_start": "warm"}}, "cold_start"),
]


def test_the_chart_schema_is_the_generated_one() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text(encoding="utf-8"))
    assert schema["properties"]["gateway"]["properties"]["config"] == chart_schema()


@pytest.mark.parametrize(("config", "needle"), BAD)
def test_a_misspelt_or_bad_key_fails_the_values_schema(config: dict[str, Any], needle: str) -> None:
    values = {"gateway": {"config": config}}
    with (
        helm_python.Chart.load(CHART_DIR) as chart,
        pytest.raises(helm_python.HelmValuesError) as exc,
    ):
        chart.validate_schema(values)
    assert needle in str(exc.value)


def test_helm_lint_fails_on_a_misspelt_key_and_passes_a_good_config() -> None:
    bad = helm_lint({"gateway": {"config": {"engine": {"max_depht": 2}}}})
    assert any("max_depht" in str(e) for e in bad["errors"]), bad
    good = helm_lint({"gateway": {"config": GOOD}})
    assert good["errors"] == [], good


def test_the_gateway_reads_the_file_the_chart_writes(tmp_path: Path) -> None:
    """The chart's config.yaml for a good config resolves to the same values."""
    rendered = render({"gateway": {"config": GOOD}})
    text = rendered.one("ConfigMap", f"{RELEASE}-spec-gateway-config")["data"]["config.yaml"]
    path = tmp_path / "config.yaml"
    path.write_text(text, encoding="utf-8")
    settings = resolve(config_file=path)
    assert settings.max_running == 8
    assert settings.control.hysteresis == 0.2
    assert settings.tenants.replicas == 3
    assert settings.engine.spec_tokens_per_batch_size == [(1, 4, 3)]


@pytest.mark.parametrize(("config", "needle"), BAD)
def test_the_gateway_refuses_what_the_schema_refuses(
    tmp_path: Path, config: dict[str, Any], needle: str
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        resolve(config_file=path)
    assert needle in str(caught.value)
