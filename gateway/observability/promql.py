"""PromQL building blocks of the dashboards: one deployment's series, rates, ratios.

Every series a panel reads carries the dashboard's scope, `namespace`, `job` and
`instance` (Grafana's variables; `All` is `.*`, which also matches a series without
the label), so two deployments in one Prometheus are never summed together. Rates
use `$__rate_interval`; a ratio divides by `(denominator > 0)` so idle periods draw
gaps, not NaN (DESIGN.md, conventions).
"""

from __future__ import annotations

SCOPE = 'namespace=~"$namespace", job=~"$job", instance=~"$instance"'
#: One deployment's series (`S`), and of the selected request classes (`C`).
S = "{" + SCOPE + "}"
C = "{" + SCOPE + ', class=~"$class"}'
RI = "[$__rate_interval]"
#: The labels that name one scraped replica: what `specgw_build_info` joins on.
TARGET = "namespace, job, instance"


def rate(metric: str, by: str = "class", selector: str = C, window: str = RI) -> str:
    return f"sum by ({by}) (rate({metric}{selector}{window}))"


def total_rate(metric: str, selector: str = S) -> str:
    return f"sum(rate({metric}{selector}{RI}))"


def ratio(num: str, den: str) -> str:
    return f"{num}\n  / ({den} > 0)"


def quantile(q: float, metric: str, by: str = "class", selector: str = C) -> str:
    return f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{selector}{RI})))"


def by_drafter(metric: str, window: str = RI) -> str:
    """`sum by (drafter, class)` of a per-class counter's rate, each replica's series
    labelled with its drafter from `specgw_build_info` (value 1, one per replica)."""
    return (
        f"sum by (drafter, class) (\n    rate({metric}{C}{window})\n"
        f"    * on ({TARGET}) group_left (drafter) specgw_build_info{S}\n  )"
    )
