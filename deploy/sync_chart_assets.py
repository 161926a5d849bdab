"""Copy the Prometheus rules, Grafana dashboards and default flags into the Helm chart,
and the settings file's schema into its values schema.

Helm's `.Files` reaches only files inside the chart directory, so the chart carries copies
under `helm/spec-gateway/files/`. The sources stay where their owners keep them:

    deploy/prometheus/rules.yml   -> files/prometheus/rules.yml      (byte copy)
    grafana/dashboards/*.json     -> files/dashboards/*.json         (byte copies)
    gateway.flags.document        -> files/flags/flags.json          (generated from code)
    gateway.config.chart_schema   -> values.schema.json, at gateway.config (generated; the
                                     rest of the file is the chart's own and kept as is)

Run `python deploy/sync_chart_assets.py` after changing a source, and
`python deploy/sync_chart_assets.py --check` in CI (exit 1 when the chart is stale);
tests/deploy/test_chart_assets.py asserts the same byte identity.

The rules carry each runbook as its path in the repository (`deploy/runbooks/x.md`), which
promtool's tests and the repository's own checks read; Alertmanager wants an absolute URL.
The chart makes them absolute under `metrics.prometheusRule.runbookBaseUrl`, and
`--runbook-base-url URL` prints the rules file the same way for a Prometheus that loads it
directly (`rules_with_runbook_base`, one rule for both).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CHART_FILES = Path("helm/spec-gateway/files")
RULES_SOURCE = Path("deploy/prometheus/rules.yml")
DASHBOARDS_SOURCE = Path("grafana/dashboards")
VALUES_SCHEMA = Path("helm/spec-gateway/values.schema.json")
#: How each alert names its runbook in the rules file (a path in this repository).
RUNBOOK_PREFIX = "runbook_url: deploy/runbooks/"
#: Where the settings file's schema sits in the values schema.
CONFIG_SCHEMA_PATH = ("properties", "gateway", "properties", "config")


def flags_json() -> bytes:
    """flags.json at the code defaults, as `python -m gateway.flags.document` prints it."""
    from gateway.flags.document import flags_document

    return (json.dumps(flags_document(), indent=2) + "\n").encode("utf-8")


def values_schema(path: Path) -> bytes:
    """The chart's values schema with `gateway.config` replaced by the settings' schema
    (`gateway.config.chart_schema`), written as the file is: JSON, indent 2."""
    from gateway.config import chart_schema

    schema = json.loads(path.read_text(encoding="utf-8"))
    node = schema
    for key in CONFIG_SCHEMA_PATH[:-1]:
        node = node[key]
    node[CONFIG_SCHEMA_PATH[-1]] = chart_schema()
    return (json.dumps(schema, indent=2) + "\n").encode("utf-8")


def rules_with_runbook_base(rules: str, base: str) -> str:
    """The rules text with every `runbook_url` absolute: `base` is where the repository's
    `deploy/runbooks/` directory is browsable (e.g.
    https://github.com/<org>/spec-gateway/blob/v0.1.0/deploy/runbooks). The chart's
    PrometheusRule template applies the same replacement."""
    return rules.replace(RUNBOOK_PREFIX, f"runbook_url: {base.rstrip('/')}/")


def expected_assets(root: Path = REPO_ROOT) -> dict[Path, bytes]:
    """Chart-relative path (under the repository root) -> the bytes it must hold."""
    files = root / CHART_FILES
    assets: dict[Path, bytes] = {files / "flags" / "flags.json": flags_json()}
    rules = root / RULES_SOURCE
    if rules.is_file():
        assets[files / "prometheus" / "rules.yml"] = rules.read_bytes()
    for dashboard in sorted((root / DASHBOARDS_SOURCE).glob("*.json")):
        assets[files / "dashboards" / dashboard.name] = dashboard.read_bytes()
    if (root / VALUES_SCHEMA).is_file():
        assets[root / VALUES_SCHEMA] = values_schema(root / VALUES_SCHEMA)
    return assets


def stale_paths(root: Path = REPO_ROOT) -> list[Path]:
    """Chart files that differ from their source, are missing, or have no source any more."""
    expected = expected_assets(root)
    stale = [p for p, data in expected.items() if not p.is_file() or p.read_bytes() != data]
    managed = [root / CHART_FILES / sub for sub in ("prometheus", "dashboards", "flags")]
    for folder in managed:
        stale.extend(p for p in sorted(folder.glob("*")) if p.is_file() and p not in expected)
    return stale


def sync(root: Path = REPO_ROOT) -> list[Path]:
    """Write every stale asset (and delete orphans); returns the paths touched."""
    expected = expected_assets(root)
    touched = stale_paths(root)
    for path in touched:
        if path in expected:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(expected[path])
        else:
            path.unlink()
    return touched


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="Only report stale files (exit 1).")
    parser.add_argument(
        "--runbook-base-url",
        metavar="URL",
        help="Print deploy/prometheus/rules.yml with absolute runbook_urls under URL (where "
        "deploy/runbooks/ is browsable) and exit; nothing is synced.",
    )
    args = parser.parse_args(argv)
    if args.runbook_base_url:
        rules = (REPO_ROOT / RULES_SOURCE).read_text(encoding="utf-8")
        sys.stdout.write(rules_with_runbook_base(rules, args.runbook_base_url))
        return 0
    # Run as a script, Python puts deploy/ on the path, not the repository root.
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    if args.check:
        stale = stale_paths()
        for path in stale:
            print(f"stale: {path.relative_to(REPO_ROOT)}")
        return 1 if stale else 0
    for path in sync():
        print(f"synced: {path.relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
