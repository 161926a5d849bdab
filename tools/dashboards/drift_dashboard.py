"""The drift dashboard: per class, what speculation does now and when it changed.

Every expression reads raw `specgw_*` series in the dashboard's scope (`promql`), so it
works without the recording rules; per-class panels sum by `class_id` and show each
class's label through `specgw_class_info` (`promql.labelled`). The drafter panel joins
each replica's series with its `specgw_build_info`, so replicas running different
drafters compare class by class.
"""

from __future__ import annotations

from gateway.observability.promql import (
    CLASS_LEGEND,
    RI,
    S,
    by_drafter,
    labelled,
    quantile,
    rate,
    ratio,
)
from tools.dashboards.grafana import Annotation, Dashboard, Panel, Target

ACCEPTANCE_LENGTH = labelled(
    "1 + " + ratio(rate("specgw_accepted_tokens_total"), rate("specgw_verify_steps_total"))
)
VLLM_ACCEPTANCE_LENGTH = "1 + " + ratio(
    f"sum(rate(vllm:spec_decode_num_accepted_tokens_total{S}{RI}))",
    f"sum(rate(vllm:spec_decode_num_drafts_total{S}{RI}))",
)
DEPTH_PROFILE = ratio(
    rate("specgw_accepted_tokens_per_position_total", by="position"),
    rate("specgw_draft_tokens_per_position_total", by="position"),
)
FALLBACK_SHARE = labelled(
    ratio(rate("specgw_fallback_requests_total"), rate("specgw_acceptance_length_count"))
)
#: 1 + accepted / verify steps per (drafter, class), pooled over the dashboard's range.
ACCEPTANCE_BY_DRAFTER = labelled(
    "1 + "
    + ratio(
        by_drafter("specgw_accepted_tokens_total", "[$__range]"),
        by_drafter("specgw_verify_steps_total", "[$__range]"),
    )
)


def _gauge(metric: str) -> str:
    """A per-class gauge, its largest value over the scope's replicas, labelled."""
    return labelled(f"max by (class_id) ({metric}{S})")


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
                    Target(ACCEPTANCE_LENGTH, CLASS_LEGEND),
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
                (Target(_gauge("specgw_speculation_depth"), CLASS_LEGEND),),
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
                (Target(FALLBACK_SHARE, CLASS_LEGEND),),
                (12, 9, 12, 8),
                "Share of finished requests that ran without drafts.",
                unit="percentunit",
                min=0,
                max=1,
            ),
            Panel(
                "Output tokens/s by class",
                "timeseries",
                (Target(labelled(rate("specgw_output_tokens_total")), CLASS_LEGEND),),
                (0, 17, 8, 8),
                unit="short",
            ),
            Panel(
                "TPOT p50 by class",
                "timeseries",
                (Target(quantile(0.5, "specgw_time_per_output_token_seconds"), CLASS_LEGEND),),
                (8, 17, 8, 8),
                "Median time per output token after the first.",
                unit="s",
            ),
            Panel(
                "Drift score by class",
                "timeseries",
                (Target(_gauge("specgw_drift_score"), CLASS_LEGEND),),
                (16, 17, 8, 8),
                "Page-Hinkley statistic; the controller calls a drift above its threshold.",
            ),
            Panel(
                "Per-request acceptance length distribution",
                "heatmap",
                (
                    Target(
                        rate("specgw_acceptance_length_bucket", by="le"), "{{le}}", "A", "heatmap"
                    ),
                ),
                (0, 25, 24, 8),
                "How spread the per-request acceptance length is (histogram buckets).",
            ),
            Panel(
                "Batch lowered for a class's floor",
                "timeseries",
                (Target(labelled(rate("specgw_batch_lowered_requests_total")), CLASS_LEGEND),),
                (0, 33, 8, 8),
                "Requests/s that lowered the deeper requests in flight to keep their class's "
                "batch floor (flag batch-floor); 0 while the floor is off.",
                unit="reqps",
                min=0,
            ),
            Panel(
                "Prompt tokens/s by class",
                "timeseries",
                (Target(labelled(rate("specgw_prompt_tokens_total")), CLASS_LEGEND),),
                (8, 33, 8, 8),
                "Prefill load by class: long prompts make every batch-mate's steps longer.",
                unit="short",
            ),
            Panel(
                "Draft tokens/s by class: proposed and rejected",
                "timeseries",
                (
                    Target(labelled(rate("specgw_draft_tokens_total")), f"proposed {CLASS_LEGEND}"),
                    Target(
                        labelled(
                            rate("specgw_draft_tokens_total")
                            + "\n  - "
                            + rate("specgw_accepted_tokens_total")
                        ),
                        f"rejected {CLASS_LEGEND}",
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
                        f"sum by (filed) (rate(specgw_engine_steps_total{S}{RI}))",
                        "filed={{filed}}",
                    ),
                ),
                (0, 41, 12, 7),
                "Timed engine steps, by whether the step-cost model filed them: decode-only "
                "steps whose batch the gateway knows. A filed share near 0 under load leaves "
                "the depths priced at their start-up calibration.",
                unit="short",
                min=0,
            ),
            Panel(
                "Engine steps/s by the depth they verified",
                "timeseries",
                (
                    Target(
                        f"sum by (depth) (rate(specgw_engine_step_depth_total{S}{RI}))",
                        "depth={{depth}}",
                    ),
                ),
                (12, 41, 12, 7),
                "Steps with decoding requests, by the drafts each of them verified (`mixed`: "
                "their depths differed). With the step rule on (specgw_build_info's step_rule "
                "label) the engine picks one depth per step for the whole batch; a shift "
                "toward 0 under load is the rule's guard at work.",
                unit="short",
                min=0,
            ),
            Panel(
                "Acceptance length by drafter and class, over the time range",
                "bargauge",
                (Target(ACCEPTANCE_BY_DRAFTER, f"{CLASS_LEGEND} · {{{{drafter}}}}", instant=True),),
                (0, 48, 24, 10),
                "Each class's acceptance length on the replicas of each drafter "
                "(specgw_build_info's drafter label), pooled over the dashboard's time range: "
                "with one drafter rolled out beside another (EAGLE 3.1 over EAGLE-3 on some "
                "replicas), the classes that gained or lost sit side by side.",
                decimals=2,
                min=1,
            ),
            Panel(
                "Draft positions measured by class",
                "timeseries",
                (Target(_gauge("specgw_class_measured_positions"), CLASS_LEGEND),),
                (0, 58, 24, 7),
                "Positions of each class's depth profile its own drafts have tried, from "
                "position 1. 0 with traffic: the class has never drafted (k = 0 from its start, "
                "by its policy, a flag or a batch-mate's floor), and its acceptance is the "
                "prior's or a similar class's, which only its probes can correct.",
                min=0,
                decimals=0,
            ),
            Panel(
                "Engine steps/s by CUDA graph mode",
                "timeseries",
                (
                    Target(
                        f"sum by (mode) (rate(specgw_engine_cudagraph_steps_total{S}{RI}))",
                        "{{mode}}",
                    ),
                ),
                (0, 65, 24, 7),
                "How each step's target forward ran (vLLM's cudagraph_metrics, on with CUDA "
                "graphs): FULL graph, PIECEWISE (attention outside the graph: a step mixing "
                "k = 0 with drafting requests, or a width not captured at its batch size) or "
                "NONE (eager). The one-depth-per-step rule is there to keep this FULL; empty "
                "on the CPU engine, which reports no graph mode.",
                unit="short",
                min=0,
            ),
        ),
        annotations=(
            Annotation(
                "k decisions",
                labelled(
                    "sum by (class_id, from_k, to_k, reason) "
                    f"(increase(specgw_controller_decisions_total{S}{RI})) > 0"
                ),
                "k {{from_k}} → {{to_k}}",
                "{{label}}: {{reason}}",
                "blue",
            ),
            Annotation(
                "drift events",
                labelled(
                    f"sum by (class_id, direction) (increase(specgw_drift_events_total{S}{RI})) > 0"
                ),
                "drift {{direction}}",
                "{{label}}",
                "red",
            ),
        ),
    )
