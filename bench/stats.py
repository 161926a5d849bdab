"""Figures from request records: per run, per mode (median and spread over repeats), oracle.

Definitions (all from the records, nothing assumed):
- tokens/s of a run = output tokens of its successful requests / the run's wall time.
- class speed = a class's output tokens / the sum of its requests' end-to-end times:
  the rate at which one request of that class receives tokens, queueing included.
  It is what a mixed run can say per class, and it lets the per-class hindsight
  oracle be assembled from static runs of the same traffic. A mode's class speed
  pools the requests of all its repeats (a class has 2 to 13 requests a run; a
  median of per-run speeds of 2 requests each is one request's luck).
- class ratio (mode A / mode B, one class) = the two pooled class speeds' ratio,
  with a paired bootstrap interval: both modes replay the same requests, so a
  draw resamples request slots (repeat, index) and takes both modes' results of
  each slot.
- acceptance length of a class = 1 + accepted / verify steps over its requests
  (vLLM's definition, bonus token included); 1.0 when it never speculated.
- oracle (hindsight, per arrival): for every (class, phase), the static k (0..K;
  k = 0 is the `k0` mode on the speculative engine) whose
  runs gave the best median class speed; its speed is estimated by taking each
  request's end-to-end time from that k's run (same request, same position in
  the same workload) and dividing all output tokens by the summed times. The
  same estimator is applied to the other modes for a like-for-like ratio. It
  ignores that mixing depths changes the batch, which is why it is an estimate.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from bench.replay import RequestRecord
from bench.runner import RunResult
from engine.interface import token_steps

T = TypeVar("T")


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank-interpolated percentile (q in 0..100); None for no values."""
    data = sorted(values)
    if not data:
        return None
    if len(data) == 1:
        return data[0]
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True)
class Spread:
    median: float | None
    low: float | None
    high: float | None
    n: int

    def to_json(self) -> dict[str, float | int | None]:
        return {"median": self.median, "min": self.low, "max": self.high, "n": self.n}


def median_interval(values: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """The median and its distribution-free interval: order statistics j and n + 1 - j,
    j the largest rank with P(Binomial(n, 1/2) < j) <= (1 - level) / 2 (the sign test's
    interval); with too few values for that level, the range."""
    xs = sorted(values)
    n = len(xs)
    tail = (1 - level) / 2
    below = 0.0
    j = 0
    for r in range(n + 1):
        below += math.comb(n, r) / 2**n  # P(X <= r)
        if below > tail:
            j = r  # P(X < r + 1) > tail: rank r is the last that keeps P(X < rank) <= tail
            break
    if j < 1:
        return statistics.median(xs), xs[0], xs[-1]
    return statistics.median(xs), xs[j - 1], xs[n - j]


def bootstrap_interval(
    items: Sequence[T], stat: Callable[[list[T]], float], rounds: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """95 % interval of `stat(items)` over resamples of whole items (pairs, bursts: the
    unit that is independent), seeded."""
    rng = random.Random(seed)
    draws = sorted(stat(rng.choices(items, k=len(items))) for _ in range(rounds))
    return draws[int(0.025 * rounds)], draws[int(0.975 * rounds) - 1]


def spread(values: Iterable[float | None]) -> Spread:
    data = [v for v in values if v is not None]
    if not data:
        return Spread(None, None, None, 0)
    return Spread(statistics.median(data), min(data), max(data), len(data))


def acceptance_length(records: Iterable[RequestRecord]) -> float | None:
    recs = list(records)
    if not recs:
        return None
    steps = sum(r.verify_steps for r in recs)
    if steps == 0:
        return 1.0
    return 1.0 + sum(r.accepted_tokens for r in recs) / steps


def class_speed(records: Iterable[RequestRecord]) -> float | None:
    recs = [r for r in records if r.ok]
    busy = sum(r.e2e for r in recs)
    return sum(r.output_tokens for r in recs) / busy if busy > 0 else None


def by_family(records: Iterable[RequestRecord]) -> dict[str, list[RequestRecord]]:
    out: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        out[r.family].append(r)
    return dict(sorted(out.items()))


@dataclass(frozen=True, slots=True)
class RunFigures:
    tokens_per_s: float
    tpot_p50: float | None
    tpot_p99: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    errors: int
    requests: int
    acceptance: dict[str, float | None]
    mean_k: dict[str, float | None]
    speed: dict[str, float | None]
    #: Successful requests of each class in the run: what each class figure rests on.
    count: dict[str, int]


def run_tokens_per_s(run: RunResult) -> float:
    """Output tokens of the run's successful requests / its wall time (0 without one)."""
    if run.wall_s <= 0:
        return 0.0
    return sum(r.output_tokens for r in run.records if r.ok) / run.wall_s


def run_figures(run: RunResult) -> RunFigures:
    ok = [r for r in run.records if r.ok]
    tpots = [r.tpot for r in ok if r.tpot is not None]
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    fam = by_family(ok)
    return RunFigures(
        tokens_per_s=run_tokens_per_s(run),
        tpot_p50=percentile(tpots, 50),
        tpot_p99=percentile(tpots, 99),
        ttft_p50=percentile(ttfts, 50),
        ttft_p99=percentile(ttfts, 99),
        errors=len(run.records) - len(ok),
        requests=len(run.records),
        acceptance={f: acceptance_length(rs) for f, rs in fam.items()},
        mean_k={f: _mean_k(rs) for f, rs in fam.items()},
        speed={f: class_speed(rs) for f, rs in fam.items()},
        count={f: len(rs) for f, rs in fam.items()},
    )


def _mean_k(records: list[RequestRecord]) -> float | None:
    ks = [r.k for r in records if r.k is not None]
    return statistics.fmean(ks) if ks else None


Cell = tuple[str, str]  # (mode, arrival)


def group_runs(runs: Iterable[RunResult]) -> dict[Cell, list[RunResult]]:
    out: dict[Cell, list[RunResult]] = defaultdict(list)
    for run in runs:
        out[(run.key.mode, run.key.arrival)].append(run)
    return dict(out)


def summarise_cell(runs: list[RunResult]) -> dict[str, object]:
    """Median and spread over repeats of every headline figure of one (mode, arrival)."""
    figs = [run_figures(r) for r in runs]

    def sp(get: Callable[[RunFigures], float | None]) -> dict[str, float | int | None]:
        return spread(get(f) for f in figs).to_json()

    families = sorted({fam for f in figs for fam in f.acceptance})
    return {
        "repeats": len(runs),
        "requests": sum(f.requests for f in figs),
        "errors": sum(f.errors for f in figs),
        "tokens_per_s": sp(lambda f: f.tokens_per_s),
        "tpot_p50_s": sp(lambda f: f.tpot_p50),
        "tpot_p99_s": sp(lambda f: f.tpot_p99),
        "ttft_p50_s": sp(lambda f: f.ttft_p50),
        "ttft_p99_s": sp(lambda f: f.ttft_p99),
        "acceptance_by_class": {
            c: spread(f.acceptance.get(c) for f in figs).median for c in families
        },
        "mean_k_by_class": {c: spread(f.mean_k.get(c) for f in figs).median for c in families},
        "speed_by_class": pooled_class_speeds(runs),
        "requests_by_class": {
            c: spread(float(f.count.get(c, 0)) for f in figs).median for c in families
        },
        "notes": sorted({n for r in runs for n in r.notes}),
    }


def pooled_class_speeds(runs: Iterable[RunResult]) -> dict[str, float | None]:
    """Per class: its speed over the successful requests of all the runs given."""
    return {
        f: class_speed(rs) for f, rs in by_family(r for run in runs for r in run.records).items()
    }


@dataclass(frozen=True, slots=True)
class ClassRatio:
    """Pooled class speed of mode A / of mode B, and a bootstrap interval around it."""

    ratio: float
    low: float
    high: float
    #: Request slots (repeat, index) both modes completed: what the ratio rests on.
    pairs: int

    def to_json(self) -> dict[str, float | int]:
        return {"ratio": self.ratio, "low": self.low, "high": self.high, "pairs": self.pairs}


def class_ratios(
    a_runs: Iterable[RunResult],
    b_runs: Iterable[RunResult],
    draws: int = 2000,
    level: float = 0.9,
    seed: int = 0,
) -> dict[str, ClassRatio]:
    """Per class: mode A's pooled class speed / mode B's, over the slots both completed.

    Paired: slot (repeat, index) is the same request in both modes, so a bootstrap
    draw resamples slots with replacement and keeps each slot's two results
    together; the interval is the draws' central `level` share. Seeded: a report
    re-rendered from the same runs gives the same interval.
    """

    def slots(runs: Iterable[RunResult]) -> dict[tuple[int, int], RequestRecord]:
        return {(run.key.repeat, r.index): r for run in runs for r in run.records if r.ok}

    a, b = slots(a_runs), slots(b_runs)
    # Per class, per slot: (A's tokens, A's seconds, B's tokens, B's seconds).
    by_class: dict[str, list[tuple[int, float, int, float]]] = defaultdict(list)
    for slot in sorted(a.keys() & b.keys()):
        ra, rb = a[slot], b[slot]
        if ra.family == rb.family:
            by_class[ra.family].append((ra.output_tokens, ra.e2e, rb.output_tokens, rb.e2e))
    rng = random.Random(seed)
    out: dict[str, ClassRatio] = {}
    for family, pairs in sorted(by_class.items()):
        ratio = _pair_ratio(pairs)
        if ratio is None:
            continue
        samples = sorted(
            v
            for _ in range(draws)
            if (v := _pair_ratio(rng.choices(pairs, k=len(pairs)))) is not None
        )
        tail = (1.0 - level) / 2
        low = samples[int(tail * (len(samples) - 1))] if samples else ratio
        high = samples[int((1.0 - tail) * (len(samples) - 1))] if samples else ratio
        out[family] = ClassRatio(ratio, low, high, len(pairs))
    return out


def _pair_ratio(pairs: Sequence[tuple[int, float, int, float]]) -> float | None:
    tokens_a = seconds_a = tokens_b = seconds_b = 0.0
    for ta, sa, tb, sb in pairs:
        tokens_a += ta
        seconds_a += sa
        tokens_b += tb
        seconds_b += sb
    if tokens_a <= 0 or tokens_b <= 0 or seconds_a <= 0 or seconds_b <= 0:
        return None
    return (tokens_a / seconds_a) / (tokens_b / seconds_b)


def decode_step_s(record: RequestRecord) -> float | None:
    """Seconds per decode step of one request as its client saw them: (e2e - TTFT) over
    the steps after the first token (`engine.interface.token_steps` less the prefill's),
    the cost the controller's model estimates per depth. None with fewer than 2 such steps."""
    steps = token_steps(record.output_tokens, record.verify_steps, record.accepted_tokens) - 1
    if not record.ok or record.ttft is None or steps < 2:
        return None
    return (record.e2e - record.ttft) / steps


def median_e2e_by_index(runs: list[RunResult]) -> dict[int, tuple[float, int]]:
    """Per request index: (median e2e over repeats, output tokens), successful requests only."""
    e2e: dict[int, list[float]] = defaultdict(list)
    tokens: dict[int, int] = {}
    for run in runs:
        for r in run.records:
            if r.ok:
                e2e[r.index].append(r.e2e)
                tokens[r.index] = r.output_tokens
    return {i: (statistics.median(v), tokens[i]) for i, v in e2e.items()}


def estimated_speed(per_index: dict[int, tuple[float, int]]) -> float | None:
    busy = sum(e for e, _ in per_index.values())
    return sum(t for _, t in per_index.values()) / busy if busy > 0 else None


def oracle(
    static_runs: dict[int, list[RunResult]],
) -> tuple[dict[str, int], dict[int, tuple[float, int]]]:
    """({"family/phase": best k}, per-index (e2e, tokens) assembled from the best k's runs)."""
    per_k = {k: median_e2e_by_index(runs) for k, runs in static_runs.items()}
    groups: dict[tuple[str, int], set[int]] = defaultdict(set)
    for runs in static_runs.values():
        for r in runs[0].records:
            groups[(r.family, r.phase)].add(r.index)
    choice: dict[str, int] = {}
    assembled: dict[int, tuple[float, int]] = {}
    for (family, phase), indices in sorted(groups.items()):
        best_k, best_speed = None, -1.0
        for k, table in sorted(per_k.items()):
            speed = estimated_speed({i: table[i] for i in indices if i in table})
            if speed is not None and speed > best_speed:
                best_k, best_speed = k, speed
        if best_k is None:
            continue
        choice[f"{family}/{phase}"] = best_k
        assembled.update({i: per_k[best_k][i] for i in indices if i in per_k[best_k]})
    return choice, assembled


def settle_points(records: list[RequestRecord], tail_share: float = 0.9) -> dict[str, int | None]:
    """Per "family/phase": requests of that class until k settles, from the k-over-time data.

    Settled at request i = from i to the end of the phase, at least `tail_share`
    of that class's requests get the phase's final modal k (exploration probes
    of the remaining share are allowed). None when the class had no k recorded.
    """
    seqs: dict[tuple[str, int], list[int]] = defaultdict(list)
    for r in sorted(records, key=lambda r: r.start):
        if r.k is not None:
            seqs[(r.family, r.phase)].append(r.k)
    out: dict[str, int | None] = {}
    for (family, phase), ks in sorted(seqs.items()):
        tail = ks[len(ks) // 2 :]
        final = statistics.mode(tail)
        settled = len(ks)
        for i in range(len(ks)):
            rest = ks[i:]
            if sum(k == final for k in rest) >= tail_share * len(rest):
                settled = i
                break
        out[f"{family}/{phase}"] = settled
    return out
