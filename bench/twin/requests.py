"""The twin's request sequence and arrival times, drawn once and shared by every mode.

Common random numbers: each request's lengths and acceptance draws come from its
own stream, keyed by (seed, request index), so every mode replays the same
requests with the same draws and a 1 % difference between two modes is theirs,
not the dice's. The draws are a matrix u[position, d] (output token position at
a step's start, draft position d = 1..MAX_DEPTH); draft d is accepted at that
position when u < p_d and drafts 1..d-1 were (the chain stops at the first
rejection). Since only that prefix matters, each position keeps one number: the
run of accepted drafts there (`TwinRequest.runs`), and a request verifying k
drafts at a position accepts min(run, k) of them, for any k, in O(1).

Classes per phase are fixed counts from the mix (largest remainders), shuffled;
acceptance drift (`Shift`) scales a class's conditional acceptance position-wise
from the request at fraction `after` of its phase on.
"""

from __future__ import annotations

import itertools
import math
import random
from dataclasses import dataclass

import numpy as np

from bench.twin.confidence import draw_features, separation
from bench.twin.schema import (
    MAX_DEPTH,
    Arrival,
    ClosedArrival,
    FixedLength,
    Length,
    UniformLength,
    Workload,
)


@dataclass(frozen=True, slots=True)
class TwinRequest:
    """One request of the replay; `runs[pos]`: drafts accepted in a row at output
    position `pos` (position 0 is the prefill's first token, never verified)."""

    index: int
    class_name: str
    class_index: int
    phase: int
    #: Index of the stretch of the run between two consecutive phase starts or shifts.
    segment: int
    prompt_tokens: int
    output_tokens: int
    #: Conditional acceptance per draft position 1..MAX_DEPTH, phase scales applied.
    acceptance: tuple[float, ...]
    runs: bytes
    #: The drafter's confidence (log-odds) per (output position, draft position), drawn
    #: with the acceptance draws (`bench.twin.confidence`); None: not drawn.
    confidence: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class Segment:
    """A stretch of the request sequence with one acceptance regime: [start, end)."""

    start: int
    end: int
    phase: int
    label: str


def class_counts(mix: dict[str, float], n: int) -> list[tuple[str, int]]:
    """How many of n requests each class gets: floor of its share, the rest by
    largest remainder (ties by name), so the counts are exact and reproducible."""
    names = sorted(mix)
    exact = {c: mix[c] * n for c in names}
    counts = {c: math.floor(exact[c]) for c in names}
    left = n - sum(counts.values())
    for c in sorted(names, key=lambda c: (-(exact[c] - counts[c]), c))[:left]:
        counts[c] += 1
    return [(c, counts[c]) for c in names if counts[c] > 0]


def _draw_length(spec: Length, rng: np.random.Generator) -> int:
    if isinstance(spec, FixedLength):
        return spec.value
    if isinstance(spec, UniformLength):
        return int(rng.integers(spec.low, spec.high + 1))
    value = spec.median * math.exp(spec.sigma * float(rng.standard_normal()))
    return int(min(max(round(value), spec.min), spec.max))


def conditional(acceptance: list[float], scale: float) -> tuple[float, ...]:
    """Per-position conditional acceptance for d = 1..MAX_DEPTH, scaled and capped at 1."""
    padded = [*acceptance, *[acceptance[-1]] * (MAX_DEPTH - len(acceptance))][:MAX_DEPTH]
    return tuple(min(1.0, p * scale) for p in padded)


def accepted_runs(u: np.ndarray, p: tuple[float, ...]) -> bytes:
    """For each row of draws, how many leading drafts are accepted (u < p_d, in order)."""
    return runs_of(u < np.asarray(p)[None, :])


def runs_of(accepted: np.ndarray) -> bytes:
    """For each row of per-draft acceptances, how many leading drafts are accepted."""
    stops = np.concatenate([accepted, np.zeros((accepted.shape[0], 1), dtype=bool)], axis=1)
    return bytes(np.argmin(stops, axis=1).astype(np.uint8).tobytes())


def segments(workload: Workload) -> list[Segment]:
    """The run's stretches: each phase, cut at each of its shifts' first request."""
    out: list[Segment] = []
    start = 0
    for i, phase in enumerate(workload.phases):
        cuts = sorted({math.ceil(s.after * phase.requests) for s in phase.shifts} - {0})
        bounds = [0, *[c for c in cuts if c < phase.requests], phase.requests]
        for j, (a, b) in enumerate(itertools.pairwise(bounds)):
            label = phase.name if j == 0 else f"{phase.name}+shift{j}"
            out.append(Segment(start + a, start + b, i, label))
        start += phase.requests
    return out


def build_requests(
    workload: Workload, seed: int, confidence_scale: float | None = None
) -> list[TwinRequest]:
    """The replay's requests in order, every random draw keyed by (seed, index);
    `confidence_scale` not None also draws each draft's confidence, each class's
    separation times it (`bench.twin.confidence`)."""
    names = sorted(workload.classes)
    cuts = segments(workload)
    requests: list[TwinRequest] = []
    for p, phase in enumerate(workload.phases):
        order = [c for c, n in class_counts(phase.mix, phase.requests) for _ in range(n)]
        random.Random(f"twin:{seed}:{workload.name}:phase{p}").shuffle(order)
        for j, name in enumerate(order):
            index = len(requests)
            scale = phase.acceptance_scale.get(name, 1.0)
            for shift in phase.shifts:
                if shift.class_name == name and j >= shift.after * phase.requests:
                    scale *= shift.acceptance_scale
            spec = workload.classes[name]
            rng = np.random.default_rng([seed, index])
            prompt = _draw_length(spec.prompt_tokens, rng)
            output = _draw_length(spec.output_tokens, rng)
            p_d = conditional(spec.acceptance, scale)
            segment = next(i for i, s in enumerate(cuts) if s.start <= index < s.end)
            draws = rng.random((output, MAX_DEPTH))
            accepted = draws < np.asarray(p_d)[None, :]
            features = None
            if confidence_scale is not None:
                d_prime = separation(workload.confidence_auc(name), confidence_scale)
                features = draw_features(accepted, d_prime, seed, index)
            requests.append(
                TwinRequest(
                    index,
                    name,
                    names.index(name),
                    p,
                    segment,
                    prompt,
                    output,
                    p_d,
                    runs_of(accepted),
                    features,
                )
            )
    return requests


def poisson_times(rate_per_s: float, n: int, seed: int) -> list[float]:
    """Arrival seconds of n requests with exponential gaps at `rate_per_s`, from 0."""
    rng = random.Random(f"twin:{seed}:poisson:{rate_per_s!r}")
    t, times = 0.0, []
    for _ in range(n):
        times.append(t)
        t += rng.expovariate(rate_per_s)
    return times


def arrival_times(
    arrival: Arrival, n: int, seed: int, capacity_per_s: float | None = None
) -> list[float] | None:
    """Poisson arrival seconds, or None for a closed loop (arrivals follow completions);
    an arrival given as a load needs the no-speculation capacity in requests/s."""
    if isinstance(arrival, ClosedArrival):
        return None
    if arrival.rate_per_s is not None:
        return poisson_times(arrival.rate_per_s, n, seed)
    assert arrival.load is not None
    assert capacity_per_s is not None, "a Poisson arrival by load needs the capacity"
    return poisson_times(arrival.load * capacity_per_s, n, seed)
