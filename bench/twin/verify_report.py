"""The report's lead: the gateway steering vLLM 0.33's adaptive verification (`gateway-av`)
against it as shipped (`vllm-av`), the best static depth and no speculation, per profile and
arrival, with the per-step bound beside them; Poisson latency per class; `vllm-av` beside
vLLM's published figures; the targets (`bench.twin.verify_summary`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.twin.markdown import fmt, table
from bench.twin.modes import ADAPTIVE, NOSPEC, UPPER_BOUND
from bench.twin.modes.verify import GATEWAY_AV, VLLM_AV
from bench.twin.verify_summary import LOAD_ARRIVAL, p99_ratios

LEAD_NOTE = (
    "`vllm-av`: vLLM 0.33's adaptive verification as shipped (every request drafted at K, "
    "one online acceptance estimator pooled over all requests from its cold start, the "
    "step's draft budget and each request's admitted drafts from `engine.verify_budget`, "
    "each request verifying only those). `gateway-av`: the gateway steering it (each "
    "request's cap is its class's depth from the real controller, one estimator per class, "
    "the drafter drafting the deepest cap and skipped where every cap is 0). Each draft's "
    "confidence is drawn with its acceptance draw (`bench.twin.confidence`; the calibration "
    "per profile below). Both run on the first seed only (`runner.VERIFY_SEEDS`). "
    "`upper-bound/best static` is the clairvoyant one-depth-per-step bound."
)
COLUMNS = (
    (f"{GATEWAY_AV}/{VLLM_AV}", "gateway-av / vllm-av"),
    (f"{GATEWAY_AV}/best-static", "gateway-av / best static"),
    (f"{GATEWAY_AV}/{NOSPEC}", "gateway-av / no spec"),
    (f"worst-class:{GATEWAY_AV}", "gateway-av worst class / no spec"),
    (f"{VLLM_AV}/best-static", "vllm-av / best static"),
    (f"{VLLM_AV}/static-k{{K}}", "vllm-av / static K"),
    (f"{ADAPTIVE}/best-static", "adaptive / best static"),
    (f"{UPPER_BOUND}/best-static", "upper-bound / best static"),
)


def _median(cell: Mapping[str, Any], name: str) -> float | None:
    found = cell["ratios"].get(name)
    return None if found is None else float(found["median"])


def _lead_table(p: Mapping[str, Any]) -> list[str]:
    k = p["max_k"]
    rows = [
        [label, *(fmt(_median(cell, name.format(K=k))) for name, _ in COLUMNS)]
        for label, cell in p["arrivals"].items()
    ]
    return table(["arrival", *(title for _, title in COLUMNS)], rows)


def _latency(p: Mapping[str, Any]) -> list[str]:
    cell = p["arrivals"].get(LOAD_ARRIVAL)
    if cell is None:
        return []
    by_mode = {m: p99_ratios(cell["seeds"], m) for m in (ADAPTIVE, GATEWAY_AV, VLLM_AV)}
    first = next(iter(cell["seeds"].values()))
    base = first.get(NOSPEC, {}).get("class_latency", {})
    rows = [
        [
            cls,
            fmt(lat["ttft_p99_s"]),
            fmt(lat["e2e_p99_s"]),
            *(fmt(by_mode[m].get(cls)) for m in by_mode),
        ]
        for cls, lat in base.items()
    ]
    capacity = p.get("capacity_per_s", {})
    rate = next(iter(capacity.values()), None)
    return [
        f"Poisson at 0.8 of no-speculation capacity ({fmt(rate, 2)} requests/s full): "
        "no speculation's TTFT and end-to-end p99 (s), and each mode's end-to-end p99 over it",
        "",
        *table(
            [
                "class",
                "no spec TTFT p99",
                "no spec e2e p99",
                *(f"{m} e2e p99 / no spec" for m in by_mode),
            ],
            rows,
        ),
        "",
    ]


def _checks(checks: Sequence[Mapping[str, Any]]) -> list[str]:
    rows = [
        [c["claim"], fmt(c["value"]), c["target"], "pass" if c["pass"] else "FAIL"] for c in checks
    ]
    return table(["target", "value", "needs", "result"], rows) if rows else []


def _published(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    if not rows:
        return []
    cells = [
        [
            r["arrival"],
            f"vllm-av / {r['against']}",
            fmt(r["twin"]),
            fmt(r["published"]),
            "yes" if r["same_direction"] else "no",
            r["source"],
        ]
        for r in rows
    ]
    return [
        "`vllm-av` beside what vLLM published (on `h100-llama8b-eagle3`, the nearest "
        "shipped profile):",
        "",
        *table(["arrival", "ratio", "twin", "published", "same direction", "source"], cells),
        "",
    ]


def lead(summary: Mapping[str, Any]) -> list[str]:
    """The report's first section (module docstring)."""
    lines = [
        "## Adaptive verification: the gateway steering vLLM 0.33's against it",
        "",
        LEAD_NOTE,
        "",
    ]
    for name, p in summary["profiles"].items():
        confidence = p.get("confidence", {})
        aucs = sorted(set(confidence.get("auc", {}).values()))
        lines += [
            f"### {name}",
            "",
            f"Confidence: AUC {', '.join(fmt(a, 2) for a in aucs)} (scale "
            f"{fmt(confidence.get('scale'), 2)}); {confidence.get('source', '')}",
            "",
            *_lead_table(p),
            "",
            *_latency(p),
            *_checks(p.get("verify_checks", [])),
            "",
        ]
    lines += _published(summary.get("published", []))
    return lines
