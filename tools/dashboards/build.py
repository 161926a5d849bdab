"""The Grafana dashboards, as code, and the list of every PromQL expression we ship.

`python -m tools.dashboards` writes `grafana/dashboards/*.json`
(`python deploy/sync_chart_assets.py` copies them into the Helm chart, which packs
them into ConfigMaps labelled `grafana_dashboard: "1"`). Every dashboard has
`namespace`, `job` and `instance` variables and every query carries them
(`promql.S` / `promql.C`), so deployments sharing a Prometheus stay apart. Panels
query raw series with `$__rate_interval`, so they work without the recording rules.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway.observability.promql import CLASS_LEGEND, RI, S, quantile
from tools.dashboards.drift_dashboard import drift_dashboard
from tools.dashboards.grafana import Dashboard, Panel, Target
from tools.dashboards.vllm_dashboard import vllm_dashboard

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "grafana" / "dashboards"
RULE_FILES = (REPO / "deploy" / "prometheus" / "rules.yml",)
BUILD_LABELS = "version, model, drafter, vllm_version, max_depth"


def serving_dashboard() -> Dashboard:
    """The gateway as a service: traffic, errors, latency, queue, engine, dependencies."""
    status = f"sum by (status) (rate(specgw_requests_total{S}{RI}))"
    # Share of all requests per error type; `none` (success) is drawn too, so the panel
    # has a series when nothing fails.
    errors = (
        f"sum by (error_type) (rate(specgw_requests_total{S}{RI}))\n"
        "  / on () group_left ()"
        f" (sum(rate(specgw_requests_total{S}{RI})) > 0)"
    )
    tpot = "specgw_time_per_output_token_seconds"
    gw_ttft, engine_ttft = (
        "specgw_gateway_time_to_first_token_seconds",
        ("specgw_time_to_first_token_seconds"),
    )
    return Dashboard(
        uid="specgw-serving",
        title="spec-gateway / Serving overview",
        description="Requests, errors, latency from arrival at the gateway and at the engine, "
        "admission, engine state, build, Redis and flags.",
        panels=(
            Panel("Requests/s by status", "timeseries", (Target(status, "{{status}}"),),
                  (0, 0, 12, 8), unit="reqps"),
            Panel("Error share by type", "timeseries", (Target(errors, "{{error_type}}"),),
                  (12, 0, 12, 8), "Share of all requests, by OpenAI error type.",
                  unit="percentunit", min=0),
            Panel("Time to first token: at the gateway and at the engine", "timeseries", (
                Target(quantile(0.5, gw_ttft), f"gateway p50 {CLASS_LEGEND}"),
                Target(quantile(0.95, gw_ttft), f"gateway p95 {CLASS_LEGEND}"),
                Target(quantile(0.95, engine_ttft), f"engine p95 {CLASS_LEGEND}"),
            ), (0, 8, 8, 8), "From the request's arrival at the gateway (parsing, "
                "classification and the admission wait included), and from vLLM's own "
                "arrival stamp; the gap is what the gateway and its queue add.", unit="s"),
            Panel("End-to-end latency", "timeseries", (
                Target(quantile(0.5, "specgw_request_duration_seconds"), f"p50 {CLASS_LEGEND}"),
                Target(quantile(0.95, "specgw_request_duration_seconds"), f"p95 {CLASS_LEGEND}"),
            ), (8, 8, 8, 8), "From the engine's arrival stamp to the last token.", unit="s"),
            Panel("Time per output token", "timeseries", (
                Target(quantile(0.5, tpot), f"p50 {CLASS_LEGEND}"),
                Target(quantile(0.95, tpot), f"p95 {CLASS_LEGEND}"),
            ), (16, 8, 8, 8), unit="s"),
            Panel("Admission wait", "timeseries", (
                Target(quantile(0.5, "specgw_admission_wait_seconds"), f"p50 {CLASS_LEGEND}"),
                Target(quantile(0.95, "specgw_admission_wait_seconds"), f"p95 {CLASS_LEGEND}"),
            ), (0, 16, 8, 8), "Seconds an admitted request waited for its running slot, by "
                "class (0 while fewer than max_running run).", unit="s", min=0),
            Panel("Admission", "timeseries", (
                Target(f"sum(specgw_admission_queue_depth{S})", "waiting"),
                Target(f"sum(specgw_running_requests{S})", "running"),
            ), (8, 16, 8, 8), min=0),
            Panel("Engine ready", "stat", (
                Target(f"min by (instance) (specgw_engine_ready{S})", "{{instance}}"),
            ), (16, 16, 4, 8), "1 = ready; 0 = the replica answers 503.", min=0, max=1),
            Panel("Redis state", "state-timeline", (
                Target(f"max by (state) (specgw_redis_state{S}) > 0", "{{state}}"),
            ), (20, 16, 4, 8), "Cluster-state store: up, degraded (local only), disabled."),
            Panel("Engine state", "state-timeline", (
                Target(f"max by (instance, state) (specgw_engine_state{S}) > 0",
                       "{{instance}} {{state}}"),
            ), (0, 24, 16, 6), "The engine as each replica sees it: ready, starting, hung "
                "(an idle canary or admitted work unanswered), draining, dead, restarting, "
                "failed."),
            Panel("Build", "stat", (
                Target(f"count by ({BUILD_LABELS}) (specgw_build_info{S})",
                       "{{version}} {{model}} {{drafter}} vLLM {{vllm_version}} K={{max_depth}}"),
            ), (16, 24, 8, 6), "Replicas per build (gateway version, served model, drafter, "
                "vLLM version, K): a rollout in progress shows two."),
            Panel("Flags", "stat", (
                Target(f"max by (flag) (specgw_flag_state{S})", "{{flag}}"),
            ), (0, 30, 24, 5), "Current ops flag values (1/0 for switches)."),
        ),
        class_variable=True,
    )  # fmt: skip


DASHBOARDS = {
    "specgw-drift.json": drift_dashboard,
    "specgw-serving.json": serving_dashboard,
    "specgw-vllm.json": vllm_dashboard,
}


@dataclass(frozen=True, slots=True)
class PromQLExpression:
    """One shipped expression; `source` says where it comes from (file and panel/rule)."""

    source: str
    expr: str
    #: May legitimately return no series under normal load (rare events, alert conditions).
    may_be_empty: bool = False


#: Recording rules over event counters: no series until the first event of the kind.
EVENT_RECORDS = frozenset(
    {"class:specgw_controller_decisions:increase15m", "class:specgw_drift_events:increase15m"}
)


def dashboard_expressions() -> list[PromQLExpression]:
    """Every expression of every dashboard panel and annotation."""
    out: list[PromQLExpression] = []
    for filename, build in DASHBOARDS.items():
        dashboard = build()
        for panel in dashboard.panels:
            out.extend(
                PromQLExpression(f"{filename}: {panel.title}", t.expr) for t in panel.targets
            )
        out.extend(
            PromQLExpression(f"{filename}: annotation {a.name}", a.expr, may_be_empty=True)
            for a in dashboard.annotations
        )
    return out


def shipped_expressions() -> list[PromQLExpression]:
    """Every expression of every dashboard panel, annotation and Prometheus rule."""
    out = dashboard_expressions()
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule["alert"]
                quiet = "alert" in rule or name in EVENT_RECORDS
                out.append(PromQLExpression(f"{path.name}: {name}", rule["expr"].strip(), quiet))
    return out


def all_promql_expressions() -> list[str]:
    """The PromQL text of every panel, annotation and rule (dashboard variables unexpanded:
    pass them through `concrete` before sending them to Prometheus)."""
    return [e.expr for e in shipped_expressions()]


def concrete(
    expr: str,
    rate_interval: str = "1m",
    class_regex: str = ".*",
    *,
    namespace: str = ".*",
    job: str = ".*",
    instance: str = ".*",
    time_range: str = "5m",
) -> str:
    """Expand Grafana's variables the way Grafana would, for evaluation by Prometheus
    (each variable's value is the regex its selection stands for; `.*` is All)."""
    values = {
        "$__rate_interval": rate_interval,
        "$__range": time_range,
        "$namespace": namespace,
        "$job": job,
        "$instance": instance,
        "$class": class_regex,
    }
    for name, value in values.items():
        expr = expr.replace(name, value)
    return expr


def write_dashboards(directory: Path = DASHBOARD_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for filename, build in DASHBOARDS.items():
        path = directory / filename
        path.write_text(build().to_json())
        paths.append(path)
    return paths


def main() -> None:
    for path in write_dashboards(Path(sys.argv[1]) if len(sys.argv) > 1 else DASHBOARD_DIR):
        print(path)


if __name__ == "__main__":
    main()
