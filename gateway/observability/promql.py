"""PromQL building blocks of the dashboards: one deployment's series, rates, ratios, and
each class's human label.

Every series a panel reads carries the dashboard's scope, `namespace`, `job` and
`instance` (Grafana's variables; `All` is `.*`, which also matches a series without
the label), so two deployments in one Prometheus are never summed together. Rates
use `$__rate_interval`; a ratio divides by `(denominator > 0)` so idle periods draw
gaps, not NaN (DESIGN.md, conventions).

Per-class series carry `class_id` (`gateway.observability.metrics`); a panel sums by it
and then joins `specgw_class_info`, which both keeps the classes the dashboard's `class`
variable picks (by label) and adds their `label` for the legend (`labelled`).
"""

from __future__ import annotations

SCOPE = 'namespace=~"$namespace", job=~"$job", instance=~"$instance"'
#: One deployment's series.
S = "{" + SCOPE + "}"
RI = "[$__rate_interval]"
#: The labels that name one scraped replica: what `specgw_build_info` joins on.
TARGET = "namespace, job, instance"
#: The selected classes, id -> label (value 1). Each replica exports its own info series:
#: `topk` keeps one per id, also while a rollout changes how a label reads.
CLASS_INFO = "topk by (class_id) (1, specgw_class_info{" + SCOPE + ', label=~"$class"})'
#: A class's legend: its label, and its id, since two classes can share a label.
CLASS_LEGEND = "{{label}} ({{class_id}})"


def labelled(expr: str) -> str:
    """`expr`, a vector by `class_id`, kept to the selected classes and labelled with
    each one's `label` (values unchanged: the info series is 1)."""
    return f"({expr})\n  * on (class_id) group_left (label) {CLASS_INFO}"


def rate(metric: str, by: str = "class_id", window: str = RI) -> str:
    """`sum by (by)` of a per-class family's rate over the selected classes; `by` without
    `class_id` sums over them (the join keeps the selection, adds nothing)."""
    inner = f"rate({metric}{S}{window})"
    if "class_id" not in by:
        inner = f"{inner} * on (class_id) group_left () {CLASS_INFO}"
    return f"sum by ({by}) ({inner})"


def total_rate(metric: str, selector: str = S) -> str:
    return f"sum(rate({metric}{selector}{RI}))"


def ratio(num: str, den: str) -> str:
    return f"{num}\n  / ({den} > 0)"


def quantile(q: float, metric: str) -> str:
    """The q-quantile of a per-class histogram, by class, labelled."""
    return labelled(
        f"histogram_quantile({q}, sum by (class_id, le) (rate({metric}_bucket{S}{RI})))"
    )


def by_drafter(metric: str, window: str = RI) -> str:
    """`sum by (drafter, class_id)` of a per-class counter's rate, each replica's series
    labelled with its drafter from `specgw_build_info` (value 1, one per replica)."""
    return (
        f"sum by (drafter, class_id) (\n    rate({metric}{S}{window})\n"
        f"    * on ({TARGET}) group_left (drafter) specgw_build_info{S}\n  )"
    )
