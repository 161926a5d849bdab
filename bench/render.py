"""The benchmark's report as markdown: `report.md` from a `summary.json` (`bench.report`).

Rendering only: every figure comes from the summary, so `python -m bench report`
re-renders an old run's summary byte for byte.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.report import ADAPTIVE
from gateway.control.cost_model import batch_bucket


def _yardstick_lines(summary: dict[str, Any]) -> list[str]:
    ys = summary.get("yardsticks") or {}
    headroom = ys.get("oracle_over_best_static") or {}
    worst = ys.get("k0_worst_class") or {}
    if headroom.get("value") is None and not worst:
        return []
    lines = ["", "## Reading the checks", ""]
    if headroom.get("value") is not None:
        lines.append(
            f"- Hindsight per-class oracle / best static k ({headroom['best_static']}) at c4, "
            f"both estimated from the same per-request times: {headroom['value']:.3f}. "
            "The most that choosing a static k per class and phase gains here over one k "
            "for every class."
        )
    if worst:
        cells = "; ".join(
            f"{a} {w['ratio']:.3f} ({w['class']}; 90% CI {w['low']:.2f}-{w['high']:.2f})"
            for a, w in sorted(worst.items())
        )
        lines.append(
            "- Worst class of k0 / no speculation: the same requests decoded without drafts "
            "by two gateway processes (k0's engine has the drafter loaded and skips it): "
            f"{cells}. What the worst-class check reads with nothing to find."
        )
    return lines


def _fmt(v: Any, scale: float = 1.0, digits: int = 1) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int | float):
        return f"{v * scale:.{digits}f}"
    return str(v)


def _spread(s: dict[str, Any], scale: float = 1.0, digits: int = 1) -> str:
    if s["median"] is None:
        return "-"
    if s["n"] == 1:
        return _fmt(s["median"], scale, digits)
    return (
        f"{_fmt(s['median'], scale, digits)} "
        f"({_fmt(s['min'], scale, digits)}–{_fmt(s['max'], scale, digits)})"
    )


def render_markdown(summary: dict[str, Any]) -> str:
    meta = summary["meta"]
    lines = [
        "# spec-gateway benchmark",
        "",
        f"Run {meta.get('started')} on {meta.get('machine')}; model: {meta.get('model_source')}; "
        f"families: {meta.get('families_source')}; {meta.get('requests_per_run')} requests "
        f"per run ({meta.get('phases')}), max_tokens {meta.get('max_tokens')}, "
        f"{meta.get('repeats')} repeat(s) per mode; seed {meta.get('seed')}; "
        f"took {_fmt(meta.get('duration_s'), 1 / 60)} min; 1-minute load average "
        f"{meta.get('loadavg_start', '-')} at the start, {meta.get('loadavg_end', '-')} at the end "
        "(above the core count = other work shared the cores).",
        "",
        "Figures are the median over repeats with (min–max) when repeated.",
        "",
        *_model_warning(meta),
        "## Checks",
        "",
        "| claim | measured | target | pass |",
        "|---|---|---|---|",
    ]
    for c in summary["checks"]:
        verdict = "n/a" if c["pass"] is None else ("PASS" if c["pass"] else "FAIL")
        value = _fmt(c["value"], 1, 3) + (f" ({c['detail']})" if c.get("detail") else "")
        lines.append(f"| {c['claim']} | {value} | {c['target']} | {verdict} |")
    lines += [
        "",
        "## Modes",
        "",
        "| mode | arrival | tokens/s | TPOT p50 ms | TPOT p99 ms | TTFT p50 ms | TTFT p99 ms "
        "| errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for mode, arrivals in summary["cells"].items():
        for arrival, cell in sorted(arrivals.items()):
            lines.append(
                f"| {mode} | {arrival} | {_spread(cell['tokens_per_s'])} "
                f"| {_spread(cell['tpot_p50_s'], 1000)} | {_spread(cell['tpot_p99_s'], 1000)} "
                f"| {_spread(cell['ttft_p50_s'], 1000)} | {_spread(cell['ttft_p99_s'], 1000)} "
                f"| {cell['errors']}/{cell['requests']} |"
            )
    lines += _yardstick_lines(summary)
    lines += _overhead_lines(summary.get("overhead"))
    lines += _class_tables(summary)
    lines += _k_lines(summary)
    lines += _oracle_lines(summary)
    lines += _step_cost_lines(summary)
    notes = [
        n for arrivals in summary["cells"].values() for c in arrivals.values() for n in c["notes"]
    ]
    notes += meta.get("notes", [])
    if notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in sorted(set(notes))]]
    return "\n".join(lines) + "\n"


def _overhead_lines(ovh: dict[str, Any] | None) -> list[str]:
    if not ovh:
        return []

    def row(label: str, key: str, digits: int = 2) -> str:
        p50, p99 = ovh.get(f"{key}_p50_ms"), ovh.get(f"{key}_p99_ms")
        if p50 is None or p99 is None:
            return ""
        return f"| {label} | {p50:.{digits}f} | {p99:.{digits}f} |"

    rows = [
        row("in-process engine client (token ids in)", "direct", 3),
        row("in-process vLLM OpenAI serving layer (JSON in, SSE out; no HTTP)", "serving"),
        row("through the gateway", "gateway"),
        row("**added by the gateway** (gateway - engine client)", "added"),
        row("HTTP floor: bare uvicorn SSE", "floor"),
        row("through the gateway, httpx client", "gateway_httpx"),
        row("added by the gateway, httpx client", "added_httpx"),
        row("HTTP floor, httpx client", "floor_httpx"),
    ]
    lines = [
        "",
        f"## Gateway overhead (no-op engine; {ovh['request']})",
        "",
        f"Latency client: {ovh.get('client', 'httpx')}.",
        "",
        "| path | p50 ms | p99 ms |",
        "|---|---|---|",
        *[r for r in rows if r],
        "",
        "| server | concurrency | requests/s | server CPU s | requests per server CPU second "
        "| client CPU s |",
        "|---|---|---|---|---|---|",
    ]
    for server, rows in (("gateway", ovh["ceiling"]), ("HTTP floor", ovh.get("floor_ceiling", []))):
        for c in rows:
            lines.append(
                f"| {server} | {c['concurrency']} | {c['requests_per_s']:.0f} "
                f"| {c['gateway_cpu_s']:.2f} | {_fmt(c['requests_per_cpu_s'], 1, 0)} "
                f"| {c['client_cpu_s']:.2f} |"
            )
    return lines


def _model_warning(meta: dict[str, Any]) -> list[str]:
    source = str(meta.get("model_source", ""))
    if source.startswith("embedded"):
        return []
    return [
        f"> **This run used the {source or 'unknown model'}.** It validates the harness; its "
        "speed and acceptance figures say nothing about spec-gateway on the embedded model. "
        "The gateway-overhead figures use a no-op engine and do not depend on the model.",
        "",
    ]


def _class_tables(summary: dict[str, Any]) -> list[str]:
    lines = [
        "",
        "## By class (acceptance length / mean k / class speed tokens/s)",
        "",
        "Acceptance and mean k: medians over repeats; class speed: over all repeats' requests.",
        "",
    ]
    for arrival in sorted({a for arrivals in summary["cells"].values() for a in arrivals}):
        classes = sorted(
            {
                c
                for arrivals in summary["cells"].values()
                for c in arrivals.get(arrival, {}).get("acceptance_by_class", {})
            }
        )
        # Every mode replays the same requests; the most that succeeded in any mode.
        counts: dict[str, float] = {}
        for arrivals in summary["cells"].values():
            for c, n in arrivals.get(arrival, {}).get("requests_by_class", {}).items():
                counts[c] = max(counts.get(c, 0.0), n or 0.0)
        lines += [f"### {arrival}", ""]
        if counts:
            # A class speed rests on this many requests a run: read small counts as noise.
            lines += [
                "Requests per run: "
                + ", ".join(f"{c} {counts[c]:.0f}" for c in classes if c in counts),
                "",
            ]
        lines.append("| mode | " + " | ".join(classes) + " |")
        lines.append("|---|" + "---|" * len(classes))
        for mode, arrivals in summary["cells"].items():
            cell = arrivals.get(arrival)
            if cell is None:
                continue
            row = [
                f"{_fmt(cell['acceptance_by_class'].get(c), 1, 2)} / "
                f"{_fmt(cell['mean_k_by_class'].get(c), 1, 1)} / "
                f"{_fmt(cell['speed_by_class'].get(c), 1, 1)}"
                for c in classes
            ]
            lines.append(f"| {mode} | " + " | ".join(row) + " |")
        lines.append("")
    return lines


def _digits(ks: list[int]) -> str:
    sep = "" if max(ks, default=0) < 10 else ","
    return sep.join(str(k) for k in ks)


def _k_lines(summary: dict[str, Any]) -> list[str]:
    """k chosen by class over time: the adaptive k sequence per repeat, phase and class."""
    lines = ["## k chosen by class over time (adaptive; each request's k in start order)", ""]
    for arrival, phases in sorted(summary.get("k_by_phase", {}).items()):
        if not phases:
            continue
        lines += [f"### {arrival}", "", "| repeat/phase | class: k sequence |", "|---|---|"]
        for phase, by_class in phases.items():
            seqs = "; ".join(f"{c}: {_digits(ks)}" for c, ks in by_class.items())
            lines.append(f"| {phase} | {seqs} |")
        lines.append("")
    return lines


def _oracle_lines(summary: dict[str, Any]) -> list[str]:
    lines = ["## Hindsight per-class oracle (best static k per class and phase)", ""]
    for arrival, orc in sorted(summary["oracle"].items()):
        if not orc["choice"]:
            continue
        choice = ", ".join(f"{k}: k={v}" for k, v in orc["choice"].items())
        lines.append(
            f"- {arrival}: estimated speed {_fmt(orc['estimated_speed'])} tokens/s per request "
            f"stream; adaptive {_fmt(orc['mode_estimated_speed'].get(ADAPTIVE))}. Choice: {choice}"
        )
    return lines


def _step_cost_lines(summary: dict[str, Any]) -> list[str]:
    """Static modes' measured step costs per depth beside each speculative gateway's cost
    model as the run left it: where the two disagree, the controller priced depths wrong."""
    measured = {a: c for a, c in summary.get("step_costs", {}).items() if c.get("relative")}
    if not measured:
        return []
    depths = sorted({int(k) for c in measured.values() for k in c["relative"]})
    lines = [
        "",
        "## Step cost by depth (relative to k = 0)",
        "",
        "Measured: each static mode's median decode step (e2e - TTFT over the steps after "
        "the first token) over all its requests, over k0's. Model: the gateway's cost model "
        "(`/admin/costs`) at the end of the run, in the batch bucket of that concurrency.",
        "",
        "| arrival | source | " + " | ".join(f"k={k}" for k in depths) + " |",
        "|---|---|" + "---|" * len(depths),
    ]
    models = summary.get("cost_models", {})
    for arrival, cost in sorted(measured.items(), key=lambda kv: (len(kv[0]), kv[0])):
        rel = cost["relative"]
        lines.append(
            f"| {arrival} | measured (k0 step {cost['step_ms'].get('0', 0):.1f} ms) | "
            + " | ".join(f"{rel[str(k)]:.2f}" if str(k) in rel else "-" for k in depths)
            + " |"
        )
        if not arrival.startswith("c") or not arrival[1:].isdigit():
            continue
        bucket = batch_bucket(int(arrival[1:]))
        for name, buckets in sorted(models.items()):
            row = next((b for b in buckets if b.get("batch_bucket") == bucket), None)
            if row is None:
                continue
            rc = row["relative_cost"]
            lines.append(
                f"| {arrival} | {name} model (bucket {bucket}) | "
                + " | ".join(f"{rc[k]:.2f}" if k < len(rc) else "-" for k in depths)
                + " |"
            )
    return lines


def write_report(summary: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    json_path = out_dir / "summary.json"
    md_path = out_dir / "report.md"
    json_path.write_text(json.dumps(summary, indent=1, sort_keys=False))
    md_path.write_text(render_markdown(summary))
    return json_path, md_path
