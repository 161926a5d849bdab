"""The Grafana dashboards, as code, and the list of every PromQL expression we ship.

`python -m gateway.observability.dashboards` writes `grafana/dashboards/*.json`
(the Helm chart packs those files into ConfigMaps labelled `grafana_dashboard: "1"`).
Panels query raw `specgw_*` series with `$__rate_interval` and the `$class` regex,
so they work without the recording rules; ratios divide by `(x > 0)` so idle
periods draw gaps, not NaN.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from gateway.observability.grafana import Annotation, Dashboard, Panel, Target

REPO = Path(__file__).resolve().parents[2]
DASHBOARD_DIR = REPO / "grafana" / "dashboards"
RULE_FILES = (REPO / "deploy" / "prometheus" / "rules.yml",)

C = '{class=~"$class"}'
RI = "[$__rate_interval]"


def _rate(metric: str, by: str = "class", selector: str = C) -> str:
    return f"sum by ({by}) (rate({metric}{selector}{RI}))"


def _ratio(num: str, den: str) -> str:
    return f"{num}\n  / ({den} > 0)"


ACCEPTANCE_LENGTH = "1 + " + _ratio(
    _rate("specgw_accepted_tokens_total"), _rate("specgw_verify_steps_total")
)
VLLM_ACCEPTANCE_LENGTH = "1 + " + _ratio(
    "sum(rate(vllm:spec_decode_num_accepted_tokens_total" + RI + "))",
    "sum(rate(vllm:spec_decode_num_drafts_total" + RI + "))",
)
DEPTH_PROFILE = _ratio(
    _rate("specgw_accepted_tokens_per_position_total", by="position"),
    _rate("specgw_draft_tokens_per_position_total", by="position"),
)
FALLBACK_SHARE = _ratio(
    _rate("specgw_fallback_requests_total"), _rate("specgw_acceptance_length_count")
)


def _quantile(q: float, metric: str, by: str = "class", selector: str = C) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{selector}{RI})))"


def drift_dashboard() -> Dashboard:
    """Per class: what speculation does now, and when it changed."""
    return Dashboard(
        uid="specgw-drift",
        title="spec-gateway / Speculation drift",
        description="Per-class acceptance, depth profile and k; decisions and drifts as "
        "annotations.",
        panels=(
            Panel(
                "Acceptance length by class",
                "timeseries",
                (
                    Target(ACCEPTANCE_LENGTH, "{{class}}"),
                    Target(VLLM_ACCEPTANCE_LENGTH, "engine (vllm:*)"),
                ),
                (0, 0, 12, 9),
                "1 + accepted / verify steps (vLLM's definition, bonus token included). "
                "The engine line is vLLM's own counters over all classes.",
                decimals=2,
                min=1,
            ),
            Panel(
                "Speculation depth k by class",
                "timeseries",
                (Target(f"max by (class) (specgw_speculation_depth{C})", "{{class}}"),),
                (12, 0, 12, 9),
                "k given to the most recent request of each class (0 = no drafts).",
                decimals=0,
                min=0,
                stepped=True,
            ),
            Panel(
                "Depth profile: acceptance rate by draft position",
                "heatmap",
                (Target(DEPTH_PROFILE, "{{position}}"),),
                (0, 9, 12, 8),
                "P(accept draft position p) over the selected classes; position 0 is the "
                "first draft token. A drift shows as a colour change in the lower rows.",
                unit="percentunit",
                min=0,
                max=1,
            ),
            Panel(
                "Fallback (k = 0) share by class",
                "timeseries",
                (Target(FALLBACK_SHARE, "{{class}}"),),
                (12, 9, 12, 8),
                "Share of finished requests that ran without drafts.",
                unit="percentunit",
                min=0,
                max=1,
            ),
            Panel(
                "Output tokens/s by class",
                "timeseries",
                (Target(_rate("specgw_output_tokens_total"), "{{class}}"),),
                (0, 17, 8, 8),
                unit="short",
            ),
            Panel(
                "TPOT p50 by class",
                "timeseries",
                (Target(_quantile(0.5, "specgw_time_per_output_token_seconds"), "{{class}}"),),
                (8, 17, 8, 8),
                "Median time per output token after the first.",
                unit="s",
            ),
            Panel(
                "Drift score by class",
                "timeseries",
                (Target(f"max by (class) (specgw_drift_score{C})", "{{class}}"),),
                (16, 17, 8, 8),
                "Page-Hinkley statistic; the controller calls a drift above its threshold.",
            ),
            Panel(
                "Per-request acceptance length distribution",
                "heatmap",
                (
                    Target(
                        _rate("specgw_acceptance_length_bucket", by="le"), "{{le}}", "A", "heatmap"
                    ),
                ),
                (0, 25, 24, 8),
                "How spread the per-request acceptance length is (histogram buckets).",
            ),
            Panel(
                "Batch lowered for a class's floor",
                "timeseries",
                (Target(_rate("specgw_batch_lowered_requests_total"), "{{class}}"),),
                (0, 33, 8, 8),
                "Requests/s that lowered the deeper requests in flight to keep their class's "
                "batch floor (flag batch-floor); 0 while the floor is off.",
                unit="reqps",
                min=0,
            ),
            Panel(
                "Prompt tokens/s by class",
                "timeseries",
                (Target(_rate("specgw_prompt_tokens_total"), "{{class}}"),),
                (8, 33, 8, 8),
                "Prefill load by class: long prompts make every batch-mate's steps longer.",
                unit="short",
            ),
            Panel(
                "Draft tokens/s by class: proposed and rejected",
                "timeseries",
                (
                    Target(_rate("specgw_draft_tokens_total"), "proposed {{class}}"),
                    Target(
                        _rate("specgw_draft_tokens_total")
                        + "\n  - "
                        + _rate("specgw_accepted_tokens_total"),
                        "rejected {{class}}",
                        "B",
                    ),
                ),
                (16, 33, 8, 8),
                "What the drafter proposed, and what the target threw away: the verify work "
                "spent on tokens that did not become output.",
                unit="short",
                min=0,
            ),
            Panel(
                "Engine steps/s the cost model filed",
                "timeseries",
                (
                    Target(
                        f"sum by (filed) (rate(specgw_engine_steps_total{RI}))",
                        "filed={{filed}}",
                    ),
                ),
                (0, 41, 24, 7),
                "Timed engine steps, by whether the step-cost model filed them: decode-only "
                "steps whose batch the gateway knows. A filed share near 0 under load leaves "
                "the depths priced at their start-up calibration.",
                unit="short",
                min=0,
            ),
        ),
        annotations=(
            Annotation(
                "k decisions",
                "sum by (class, from_k, to_k, reason) "
                f"(increase(specgw_controller_decisions_total{C}{RI})) > 0",
                "k {{from_k}} → {{to_k}}",
                "{{class}}: {{reason}}",
                "blue",
            ),
            Annotation(
                "drift events",
                f"sum by (class, direction) (increase(specgw_drift_events_total{C}{RI})) > 0",
                "drift {{direction}}",
                "{{class}}",
                "red",
            ),
        ),
    )


def serving_dashboard() -> Dashboard:
    """The gateway as a service: traffic, errors, latency, queue, dependencies."""
    status = "sum by (status) (rate(specgw_requests_total" + RI + "))"
    # Share of all requests per error type; `none` (success) is drawn too, so the panel
    # has a series when nothing fails.
    errors = (
        "sum by (error_type) (rate(specgw_requests_total" + RI + "))\n"
        "  / on () group_left ()"
        " (sum(rate(specgw_requests_total" + RI + ")) > 0)"
    )
    return Dashboard(
        uid="specgw-serving",
        title="spec-gateway / Serving overview",
        description="Requests, errors, latency, admission queue, engine and Redis state.",
        panels=(
            Panel("Requests/s by status", "timeseries", (Target(status, "{{status}}"),),
                  (0, 0, 12, 8), unit="reqps"),
            Panel("Error share by type", "timeseries", (Target(errors, "{{error_type}}"),),
                  (12, 0, 12, 8), "Share of all requests, by OpenAI error type.",
                  unit="percentunit", min=0),
            Panel("Time to first token", "timeseries", (
                Target(_quantile(0.5, "specgw_time_to_first_token_seconds"), "p50 {{class}}"),
                Target(_quantile(0.95, "specgw_time_to_first_token_seconds"), "p95 {{class}}"),
            ), (0, 8, 8, 8), unit="s"),
            Panel("End-to-end latency", "timeseries", (
                Target(_quantile(0.5, "specgw_request_duration_seconds"), "p50 {{class}}"),
                Target(_quantile(0.95, "specgw_request_duration_seconds"), "p95 {{class}}"),
            ), (8, 8, 8, 8), unit="s"),
            Panel("Time per output token", "timeseries", (
                Target(_quantile(0.5, "specgw_time_per_output_token_seconds"), "p50 {{class}}"),
                Target(_quantile(0.95, "specgw_time_per_output_token_seconds"), "p95 {{class}}"),
            ), (16, 8, 8, 8), unit="s"),
            Panel("Admission", "timeseries", (
                Target("sum(specgw_admission_queue_depth)", "waiting"),
                Target("sum(specgw_running_requests)", "running"),
            ), (0, 16, 12, 8), min=0),
            Panel("Engine ready", "stat", (
                Target("min by (instance) (specgw_engine_ready)", "{{instance}}"),
            ), (12, 16, 6, 8), "1 = ready; 0 = the replica answers 503.", min=0, max=1),
            Panel("Redis state", "state-timeline", (
                Target("max by (state) (specgw_redis_state) > 0", "{{state}}"),
            ), (18, 16, 6, 8), "Cluster-state store: up, degraded (local only), disabled."),
            Panel("Flags", "stat", (Target("max by (flag) (specgw_flag_state)", "{{flag}}"),),
                  (0, 24, 24, 5), "Current ops flag values (1/0 for switches)."),
            Panel("Engine state", "state-timeline", (
                Target("max by (instance, state) (specgw_engine_state) > 0",
                       "{{instance}} {{state}}"),
            ), (0, 29, 24, 6), "The engine as each replica sees it: ready, starting, hung "
                "(an idle canary or admitted work unanswered), draining, dead, restarting, "
                "failed."),
        ),
        class_variable=True,
    )  # fmt: skip


DASHBOARDS = {"specgw-drift.json": drift_dashboard, "specgw-serving.json": serving_dashboard}


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


def shipped_expressions() -> list[PromQLExpression]:
    """Every expression of every dashboard panel, annotation and Prometheus rule."""
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


def concrete(expr: str, rate_interval: str = "1m", class_regex: str = ".*") -> str:
    """Expand Grafana's variables the way Grafana would, for evaluation by Prometheus."""
    return expr.replace("$__rate_interval", rate_interval).replace("$class", class_regex)


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
