"""Figures of one twin run: throughput, per-class speed, depth and acceptance, settling.

- tokens/s = output tokens / virtual makespan (first arrival to last token);
- a class's speed = its output tokens / its requests' summed latency (arrival to
  last token): what its users see, so a class slowed by its batch-mates' depth
  shows it even where the engine's tokens/s rose;
- settling: within a stretch of one acceptance regime (a phase, cut at its
  shifts), a class has settled at request i when from i on at least
  `TAIL_SHARE` of its requests get the stretch's final modal depth (the last half's
  mode; probes may take the rest), as `bench.stats.settle_points` defines it for
  the real-engine benchmark; the depth is the one its class chose at the request's
  load (`RequestRecord.chosen`), not what a probe ran or what the batch rules fitted
  it to (held below for its batch-mates' sake, riding above): those follow the
  batch's composition request by request, which no class settles. The controller keeps a depth
  per class and batch bucket (`ClassState.buckets`), so a class at a mixed load
  settles per bucket: a stretch's figure is its slowest bucket with at least
  `SETTLE_MIN` requests;
- near-best settling: the same rule on whether each request's chosen depth is within
  `NEAR_SHARE` (the controller's hysteresis) of its class's best at its load, by the steady goodput
  E[tokens | k] / step cost(k, batch) on the request's true acceptance (the workload's,
  phase shifts applied) and the profile's median step costs. Where two depths are
  within a percent of each other, a learning controller moves between them on noise,
  which the strict figure counts as unsettled; this one asks whether the class runs
  where it should. A class whose requests off its best there ran no draft at all (held at
  k = 0 by their batch, or at its own choice of 0) is named in its stretch's `undrafted`:
  nothing there could move its estimate, so its choice rests on what it learnt before
  the stretch, or on its prior.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from bench.twin.records import RequestRecord, RunResult
from bench.twin.requests import Segment
from gateway.control.cost_model import batch_bucket
from gateway.control.settings import ControllerSettings

TAIL_SHARE = 0.9
#: A depth whose steady goodput is within this share of the class's best is near-best:
#: the controller's hysteresis, the least gain for which it leaves a depth by design.
NEAR_SHARE: float = ControllerSettings.model_fields["hysteresis"].default
#: Requests of a class at one batch bucket in a stretch for its settling to count.
SETTLE_MIN = 10


def class_phase_speeds(records: Sequence[RequestRecord]) -> dict[tuple[int, int], float]:
    """(class index, phase) -> output tokens / summed latency of its requests."""
    tokens: dict[tuple[int, int], int] = defaultdict(int)
    latency: dict[tuple[int, int], float] = defaultdict(float)
    for r in records:
        key = (r.class_index, r.phase)
        tokens[key] += r.output_tokens
        latency[key] += r.last_s - r.arrival_s
    return {key: tokens[key] / latency[key] for key in sorted(tokens) if latency[key] > 0}


def class_speeds(records: Sequence[RequestRecord]) -> dict[int, float]:
    tokens: dict[int, int] = defaultdict(int)
    latency: dict[int, float] = defaultdict(float)
    for r in records:
        tokens[r.class_index] += r.output_tokens
        latency[r.class_index] += r.last_s - r.arrival_s
    return {c: tokens[c] / latency[c] for c in sorted(tokens) if latency[c] > 0}


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summarise(
    result: RunResult, class_names: Sequence[str], latency: bool = False
) -> dict[str, Any]:
    """The run's figures for `summary.json` (classes by name); `latency`: with each
    class's TTFT and end-to-end p50 / p99 (`verify_summary.class_latency`)."""
    records = result.records
    by_class: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        by_class[r.class_index].append(r)
    speeds = class_speeds(records)
    ttfts = [r.first_s - r.arrival_s for r in records]
    out = {
        "tokens_per_s": result.tokens_per_s,
        "makespan_s": result.makespan_s,
        "requests": len(records),
        "steps": result.steps,
        "ttft_p50_s": _percentile(ttfts, 0.5),
        "ttft_p99_s": _percentile(ttfts, 0.99),
        "class_speed": {class_names[c]: s for c, s in speeds.items()},
        "mean_k_by_class": {
            class_names[c]: statistics.fmean(r.k for r in rs) for c, rs in sorted(by_class.items())
        },
        "acceptance_length_by_class": {
            class_names[c]: _acceptance_length(rs) for c, rs in sorted(by_class.items())
        },
    }
    if latency:
        from bench.twin.verify_summary import class_latency

        out["class_latency"] = class_latency(records, class_names)
    return out


def _acceptance_length(records: Sequence[RequestRecord]) -> float:
    """vLLM's definition over the class's verify steps: 1 + accepted / steps (1 with none)."""
    steps = sum(r.verify_steps for r in records)
    return 1.0 + sum(r.accepted_tokens for r in records) / steps if steps else 1.0


def settle_after(ks: Sequence[int], tail_share: float = TAIL_SHARE) -> int:
    """Requests of a class until its depth settles, in one stretch (module docstring)."""
    if not ks:
        return 0
    final = statistics.mode(ks[len(ks) // 2 :])
    return near_after([k == final for k in ks], tail_share)


def near_after(near: Sequence[bool], tail_share: float = TAIL_SHARE) -> int:
    """Requests of a class until from then on `tail_share` of them are marked (near-best,
    or at the final depth for `settle_after`)."""
    for i in range(len(near)):
        rest = near[i:]
        if sum(rest) >= tail_share * len(rest):
            return i
    return len(near)


def settle_points(
    records: Sequence[RequestRecord],
    cuts: Sequence[Segment],
    class_names: Sequence[str],
    goodput: Callable[[RequestRecord], Sequence[float]] | None = None,
) -> list[dict[str, Any]]:
    """Per stretch, in order: its label, first request, and per class the requests until
    its chosen depth settled there; with `goodput` (a request's steady goodput per depth
    at its load), until its chosen depths stayed near-best instead, and the classes whose
    requests off their best there ran no draft (`undrafted`, module docstring)."""
    chosen: dict[tuple[int, int, int], list[tuple[int, RequestRecord]]] = defaultdict(list)
    for r in records:
        chosen[(r.segment, r.class_index, batch_bucket(r.load))].append((r.index, r))
    #: Per stretch, per class: its slowest bucket's (requests, undrafted).
    by_stretch: list[dict[str, tuple[int, bool]]] = [{} for _ in cuts]
    for (segment, cls, _), pairs in sorted(chosen.items(), key=lambda item: item[0]):
        if len(pairs) < SETTLE_MIN:
            continue
        ordered = [r for _, r in sorted(pairs, key=lambda pair: pair[0])]
        idle = False
        if goodput is None:
            n = settle_after([r.chosen for r in ordered])
        else:
            near = [_near(goodput(r), r.chosen) for r in ordered]
            n = near_after(near)
            off = [r for r, ok in zip(ordered, near, strict=True) if not ok]
            idle = n > 0 and not any(r.draft_tokens for r in off)
        name = class_names[cls]
        if name not in by_stretch[segment] or n > by_stretch[segment][name][0]:
            by_stretch[segment][name] = (n, idle)
    return [
        {
            "stretch": cut.label,
            "start": cut.start,
            "classes": {c: n for c, (n, _) in classes.items()},
            **({"undrafted": sorted(c for c, (_, v) in classes.items() if v)} if goodput else {}),
        }
        for cut, classes in zip(cuts, by_stretch, strict=True)
    ]


def _near(goodput: Sequence[float], k: int) -> bool:
    best = max(goodput)
    return goodput[min(k, len(goodput) - 1)] >= (1.0 - NEAR_SHARE) * best
