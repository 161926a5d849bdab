"""A small typed builder for Grafana dashboard JSON (schema 39, Grafana 10/11).

Why not grafana-foundation-sdk: its PyPI releases carry an epoch-mangled version
(`1769699998!10.1.0`) that does not pin cleanly, and the dashboards need only a
handful of panel kinds. Each dataclass renders to exactly the JSON Grafana stores,
with stable key order, so regenerating gives byte-identical files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PanelKind = Literal["timeseries", "stat", "heatmap", "state-timeline", "bargauge"]
#: The variables that pick one deployment (or replica) out of a shared Prometheus, in
#: the order Grafana resolves them (each one's choices filtered by the ones before).
SCOPE_VARIABLES = (("namespace", "Namespace"), ("job", "Job"), ("instance", "Instance"))


@dataclass(frozen=True, slots=True)
class Target:
    """One PromQL query of a panel; `legend` uses Grafana's `{{label}}` syntax."""

    expr: str
    legend: str = ""
    ref_id: str = "A"
    format: Literal["time_series", "heatmap"] = "time_series"
    #: One value per series at the range's end (bar gauges), instead of a range.
    instant: bool = False

    def render(self) -> dict[str, Any]:
        return {
            "datasource": DATASOURCE,
            "editorMode": "code",
            "expr": self.expr,
            "format": self.format,
            "instant": self.instant,
            "legendFormat": self.legend or "__auto",
            "range": not self.instant,
            "refId": self.ref_id,
        }


@dataclass(frozen=True, slots=True)
class Panel:
    """A panel at grid position (x, y) with size (w, h) on Grafana's 24-column grid."""

    title: str
    kind: PanelKind
    targets: tuple[Target, ...]
    grid: tuple[int, int, int, int]  # x, y, w, h
    description: str = ""
    unit: str = "short"
    decimals: int | None = None
    min: float | None = None
    max: float | None = None
    stepped: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    def render(self, panel_id: int) -> dict[str, Any]:
        x, y, w, h = self.grid
        defaults: dict[str, Any] = {"unit": self.unit}
        for key, value in (("decimals", self.decimals), ("min", self.min), ("max", self.max)):
            if value is not None:
                defaults[key] = value
        if self.kind == "timeseries":
            defaults["custom"] = {
                "drawStyle": "line",
                "lineInterpolation": "stepAfter" if self.stepped else "linear",
                "lineWidth": 2,
                "fillOpacity": 10,
                "spanNulls": False,
                "showPoints": "never",
            }
        targets = [
            Target(t.expr, t.legend, chr(ord("A") + i), t.format, t.instant).render()
            for i, t in enumerate(self.targets)
        ]
        return {
            "id": panel_id,
            "type": self.kind,
            "title": self.title,
            "description": self.description,
            "datasource": DATASOURCE,
            "gridPos": {"x": x, "y": y, "w": w, "h": h},
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": self.options or _default_options(self.kind),
            "targets": targets,
        }


@dataclass(frozen=True, slots=True)
class Annotation:
    """Events drawn on every time panel: one per series point of `expr` that is > 0."""

    name: str
    expr: str
    title: str
    text: str
    color: str

    def render(self) -> dict[str, Any]:
        return {
            "datasource": DATASOURCE,
            "enable": True,
            "expr": self.expr,
            "iconColor": self.color,
            "name": self.name,
            "step": "1m",
            "tagKeys": "label",
            "textFormat": self.text,
            "titleFormat": self.title,
            "useValueForTime": False,
        }


@dataclass(frozen=True, slots=True)
class Dashboard:
    """`scope_metric` is a series every scraped replica exports: the `namespace`, `job`
    and `instance` variables list its label values, each filtered by the ones before."""

    uid: str
    title: str
    description: str
    panels: tuple[Panel, ...]
    annotations: tuple[Annotation, ...] = ()
    class_variable: bool = True
    tags: tuple[str, ...] = ("spec-gateway",)
    scope_metric: str = "specgw_build_info"

    def render(self) -> dict[str, Any]:
        variables: list[dict[str, Any]] = [
            {
                "name": "datasource",
                "label": "Data source",
                "type": "datasource",
                "query": "prometheus",
                "current": {},
                "hide": 0,
                "refresh": 1,
            }
        ]
        chosen: list[str] = []
        for name, label in SCOPE_VARIABLES:
            selector = "{" + ", ".join(chosen) + "}" if chosen else ""
            variables.append(_label_variable(name, label, f"{self.scope_metric}{selector}"))
            chosen.append(f'{name}=~"${name}"')
        if self.class_variable:
            # Classes are picked by their human label (`specgw_class_info`); the panels
            # join the info series, so a label two classes share picks both.
            series = "specgw_class_info{" + ", ".join(chosen) + "}"
            variables.append(_label_variable("class", "Request class", series, "label"))
        builtin = {
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }
        return {
            "uid": self.uid,
            "title": self.title,
            "description": self.description,
            "tags": list(self.tags),
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,
            "refresh": "30s",
            "schemaVersion": 39,
            "version": 1,
            "time": {"from": "now-1h", "to": "now"},
            "annotations": {"list": [builtin, *(a.render() for a in self.annotations)]},
            "templating": {"list": variables},
            "panels": [p.render(i + 1) for i, p in enumerate(self.panels)],
        }

    def to_json(self) -> str:
        return json.dumps(self.render(), indent=2, sort_keys=False) + "\n"

    def expressions(self) -> list[str]:
        return [t.expr for p in self.panels for t in p.targets] + [a.expr for a in self.annotations]


def _label_variable(
    name: str, label: str, series: str, series_label: str | None = None
) -> dict[str, Any]:
    """A multi-valued query variable over the values of one label of `series` (its own
    name unless `series_label`), `All` = `.*` (which also matches series without the
    label, e.g. `namespace` outside Kubernetes)."""
    definition = f"label_values({series}, {series_label or name})"
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": {"query": definition, "refId": f"{name}-values"},
        "definition": definition,
        "includeAll": True,
        "allValue": ".*",
        "multi": True,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "refresh": 2,
        "sort": 1,
        "hide": 0,
    }


def _default_options(kind: PanelKind) -> dict[str, Any]:
    if kind == "timeseries":
        return {
            "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    if kind == "stat":
        return {"reduceOptions": {"calcs": ["lastNotNull"]}, "colorMode": "background"}
    if kind == "bargauge":
        return {
            "reduceOptions": {"calcs": ["lastNotNull"], "values": False},
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
            "minVizHeight": 16,
            "maxVizHeight": 24,
        }
    if kind == "heatmap":
        return {
            "calculate": False,
            "yAxis": {"axisPlacement": "left"},
            "color": {"mode": "scheme", "scheme": "Viridis", "steps": 64},
            "cellGap": 1,
        }
    return {"showValue": "auto", "mergeValues": True}
