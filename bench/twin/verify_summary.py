"""The adaptive-verification figures of `summary.json`: the gateway steering vLLM 0.33's
adaptive verification (`gateway-av`) against it as shipped (`vllm-av`), against the best
static depth and against no speculation, with the per-step bound beside them; Poisson
latency per class; the targets; and `vllm-av` beside what vLLM published.

Targets (read at the median over seeds, as `bench.twin.summary` reads its claims):
`gateway-av` >= `vllm-av` everywhere; >= `PRODUCTION_GAIN` x `vllm-av` on the
production-shaped mix at c1 and c4; >= `DENSE_GAIN` x the best static depth at c1 and
c4 on the dense profiles; every class >= `CLASS_FLOOR` of its speed without
speculation (under adaptive verification every request verifies its own drafts);
each class near-best within `SETTLE_REQUESTS` requests of a shift; and under Poisson
arrivals at `LOAD_ARRIVAL` of the no-speculation capacity no class's end-to-end p99
above `P99_SHARE` x its figure without speculation, for the gateway's default mode on
the profile's engine and for `gateway-av`. The default mode is `adaptive-step` where the
engine verifies one depth per step (a `uniform` profile: CUDA's FULL decode graphs, where
`SPECGW_CONTROL_STEP_RULE=auto` turns the step rule on) and `adaptive` elsewhere (its batch
floor at the default for the engine: `ControllerSettings.batch_floor_for`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.twin.modes import ADAPTIVE, ADAPTIVE_STEP, NOSPEC, UPPER_BOUND
from bench.twin.modes.verify import GATEWAY_AV, VLLM_AV
from bench.twin.records import RequestRecord

DENSE_GAIN = 1.05
PRODUCTION_GAIN = 1.03
CLASS_FLOOR = 0.99
SETTLE_REQUESTS = 20
P99_SHARE = 1.05
#: The Poisson arrival of the shipped workloads at 80 % of no-speculation capacity.
LOAD_ARRIVAL = "poisson-load0.8"
PRODUCTION_WORKLOAD = "production-mix"
#: Profiles whose target is a mixture of experts (the dense-profile target skips them).
MOE_PROFILES = frozenset({"kimi-k2.6-eagle31", "moe-30b-a3b", "measured-h100-qwen3-30b-a3b-eagle3"})
#: What vLLM published for adaptive verification, as (arrival, against, ratio, source):
#: throughput over the same engine at fixed K.
PUBLISHED = (
    (
        "c64",
        "static-k{K}",
        1.19,
        "vLLM PR 52228: +19 % throughput (and -16 % TPOT) at concurrency 64",
    ),
    (
        "c4",
        "static-k7",
        1 - 0.195,
        "vLLM issue 52362: 19.5 % slower than fixed K = 7 at concurrency 4",
    ),
)
#: Profile whose shape the published figures were measured nearest to (Llama-3.1-8B +
#: EAGLE-3 on an H100, vLLM's own profile).
PUBLISHED_PROFILE = "h100-llama8b-eagle3"


def verify_ratios(tps: Mapping[str, float], best: float, max_k: int) -> dict[str, float]:
    """One seed's ratios of the two modes (absent modes skipped)."""
    out: dict[str, float] = {}
    deepest = f"static-k{max_k}"
    for mode in (GATEWAY_AV, VLLM_AV):
        if mode not in tps:
            continue
        for other in (VLLM_AV, NOSPEC, deepest, ADAPTIVE, UPPER_BOUND):
            if other in tps and other != mode:
                out[f"{mode}/{other}"] = tps[mode] / tps[other]
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def class_latency(records: Sequence[RequestRecord], names: Sequence[str]) -> dict[str, Any]:
    """Per class: TTFT and end-to-end latency (arrival to last token), p50 and p99, in s."""
    ttft: dict[int, list[float]] = {}
    e2e: dict[int, list[float]] = {}
    for r in records:
        ttft.setdefault(r.class_index, []).append(r.first_s - r.arrival_s)
        e2e.setdefault(r.class_index, []).append(r.last_s - r.arrival_s)
    return {
        names[c]: {
            "ttft_p50_s": _percentile(ttft[c], 0.5),
            "ttft_p99_s": _percentile(ttft[c], 0.99),
            "e2e_p50_s": _percentile(e2e[c], 0.5),
            "e2e_p99_s": _percentile(e2e[c], 0.99),
        }
        for c in sorted(ttft)
    }


def p99_ratios(seeds: Mapping[Any, Mapping[str, Any]], mode: str) -> dict[str, float]:
    """Per class, the mode's end-to-end p99 over no speculation's, median over seeds."""
    per_class: dict[str, list[float]] = {}
    for modes in seeds.values():
        if mode not in modes or NOSPEC not in modes:
            continue
        base = modes[NOSPEC].get("class_latency", {})
        for cls, lat in modes[mode].get("class_latency", {}).items():
            if cls in base and base[cls]["e2e_p99_s"] > 0:
                per_class.setdefault(cls, []).append(lat["e2e_p99_s"] / base[cls]["e2e_p99_s"])
    return {c: sorted(v)[len(v) // 2] for c, v in sorted(per_class.items())}


def _check(claim: str, value: float | None, target: str, ok: bool | None) -> dict[str, Any]:
    return {"claim": claim, "value": value, "target": target, "pass": ok}


def default_mode(uniform: bool) -> str:
    """The gateway's default mode on an engine (module docstring)."""
    return ADAPTIVE_STEP if uniform else ADAPTIVE


def verify_checks(
    profile: str,
    workload: str,
    arrivals: Mapping[str, Mapping[str, Any]],
    default: str = ADAPTIVE,
) -> list[dict[str, Any]]:
    """The module docstring's targets on every arrival that ran `gateway-av`."""
    from bench.twin.summary import worst_settle

    out: list[dict[str, Any]] = []
    for label, cell in arrivals.items():
        r = {n: s["median"] for n, s in cell["ratios"].items()}
        if f"{GATEWAY_AV}/{VLLM_AV}" not in r:
            continue
        v = r[f"{GATEWAY_AV}/{VLLM_AV}"]
        out.append(_check(f"{label}: gateway-av / vllm-av", v, ">= 1.00", v >= 1.0))
        early = label in ("c1", "c4")
        if early and workload == PRODUCTION_WORKLOAD:
            out.append(
                _check(
                    f"{label}: gateway-av / vllm-av on the production mix",
                    v,
                    f">= {PRODUCTION_GAIN:.2f}",
                    v >= PRODUCTION_GAIN,
                )
            )
        best = r.get(f"{GATEWAY_AV}/best-static")
        if early and profile not in MOE_PROFILES and best is not None:
            out.append(
                _check(
                    f"{label}: gateway-av / best static (dense)",
                    best,
                    f">= {DENSE_GAIN:.2f}",
                    best >= DENSE_GAIN,
                )
            )
        worst = r.get(f"worst-class:{GATEWAY_AV}")
        if worst is not None:
            out.append(
                _check(
                    f"{label}: gateway-av: worst class / no spec",
                    worst,
                    f">= {CLASS_FLOOR}",
                    worst >= CLASS_FLOOR,
                )
            )
        settled = worst_settle(cell.get("near_settle", {}), GATEWAY_AV)
        if settled is not None:
            out.append(
                _check(
                    f"{label}: gateway-av: near-best after a shift ({settled[0]})",
                    settled[1],
                    f"<= {SETTLE_REQUESTS} requests",
                    settled[1] <= SETTLE_REQUESTS,
                )
            )
    loaded = arrivals.get(LOAD_ARRIVAL)
    if loaded is not None:
        for mode in (default, GATEWAY_AV):
            ratios = p99_ratios(loaded["seeds"], mode)
            if ratios:
                cls = max(ratios, key=lambda c: ratios[c])
                out.append(
                    _check(
                        f"{LOAD_ARRIVAL}: {mode}: worst class e2e p99 / no spec ({cls})",
                        ratios[cls],
                        f"<= {P99_SHARE:.2f}",
                        ratios[cls] <= P99_SHARE,
                    )
                )
    return out


def published_rows(profiles: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`vllm-av` in the twin beside vLLM's published figures, on `PUBLISHED_PROFILE`."""
    p = profiles.get(PUBLISHED_PROFILE)
    if p is None:
        return []
    rows = []
    for label, against, published, source in PUBLISHED:
        base = against.format(K=p["max_k"])
        cell = p["arrivals"].get(label)
        if cell is None:
            continue
        twin = cell["tokens_per_s"].get(VLLM_AV, {}).get("median")
        other = cell["tokens_per_s"].get(base, {}).get("median")
        ratio = twin / other if twin and other else None
        same = None if ratio is None else (ratio > 1) == (published > 1)
        rows.append(
            {
                "arrival": label,
                "against": base,
                "twin": ratio,
                "published": published,
                "same_direction": same,
                "source": source,
            }
        )
    return rows
