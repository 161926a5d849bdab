"""The step-cost model, learned online from measured engine step times.

Per batch-size bucket b (powers of two of the running batch) the seconds of one
decode step at depth k are fitted as a line, by weighted least squares over the
measured steps of finished requests with exponential forgetting:

    step_s(k, b) = a_b + s_b * k.

One request contributes (k, (e2e - ttft) / (decode_steps - 1)) once it has two
or more decode steps. The prior fixes only the *shape*, never the scale: two
pseudo-points of weight `prior_weight / 2` each at k = kbar -+ K/2 on the line
through the bucket's observed mean (kbar, level) with relative slope
rel(b) = prior_k_cost * (1 + b / prior_batch_saturation), since verification of
batch x (k + 1) tokens turns compute bound as the batch grows. The policy only
needs cost(k, b) / cost(0, b), so units cancel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.interface import RequestOutcome

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_FIELDS = ("n", "sk", "skk", "st", "skt")
#: Samples of a bucket between two refits of its line, once it has this many.
REFIT_EVERY = 16


def batch_bucket(batch: int) -> int:
    """Smallest power-of-two bucket >= batch, capped at the last one."""
    for bucket in BUCKETS:
        if batch <= bucket:
            return bucket
    return BUCKETS[-1]


def step_seconds(outcome: RequestOutcome) -> float | None:
    """Seconds per decode step of one request, or None when it says nothing."""
    if outcome.decode_steps >= 2 and outcome.e2e_s > outcome.ttft_s > 0:
        return (outcome.e2e_s - outcome.ttft_s) / (outcome.decode_steps - 1)
    if outcome.decode_steps >= 2 and outcome.tpot_s > 0 and outcome.output_tokens >= 2:
        return outcome.tpot_s * (outcome.output_tokens - 1) / (outcome.decode_steps - 1)
    return None


@dataclass(slots=True)
class _Sums:
    n: float = 0.0
    sk: float = 0.0
    skk: float = 0.0
    st: float = 0.0
    skt: float = 0.0

    def add(self, k: float, t: float, w: float = 1.0) -> None:
        self.n += w
        self.sk += w * k
        self.skk += w * k * k
        self.st += w * t
        self.skt += w * k * t

    def scale(self, f: float) -> None:
        self.n *= f
        self.sk *= f
        self.skk *= f
        self.st *= f
        self.skt *= f


@dataclass(slots=True)
class CostModel:
    """Online weighted least squares of step time on k, one line per batch bucket."""

    max_k: int
    prior_step_s: float
    prior_k_cost: float
    prior_batch_saturation: float
    prior_weight: float
    forgetting: float
    _sums: dict[int, _Sums] = field(default_factory=dict)
    _pending: dict[int, _Sums] = field(default_factory=dict)
    _lines: dict[int, tuple[float, float]] = field(default_factory=dict)
    _relative: dict[int, tuple[float, ...]] = field(default_factory=dict)
    _since_fit: dict[int, int] = field(default_factory=dict)
    #: Bumped when a line is refitted; cached decisions compare it.
    version: int = 0

    def observe(self, k: int, batch: int, seconds: float) -> None:
        bucket = batch_bucket(batch)
        sums = self._sums.setdefault(bucket, _Sums())
        sums.scale(1.0 - self.forgetting)
        sums.add(k, seconds)
        self._pending.setdefault(bucket, _Sums()).add(k, seconds)
        # Refit after every sample while a bucket is young, then every REFIT_EVERY:
        # the costs move slowly, and each refit makes every class re-decide.
        since = self._since_fit.get(bucket, 0) + 1
        if sums.n < REFIT_EVERY or since >= REFIT_EVERY:
            since = 0
            self._invalidate(bucket)
        self._since_fit[bucket] = since

    def _invalidate(self, bucket: int) -> None:
        self._lines.pop(bucket, None)
        self._relative.pop(bucket, None)
        self.version += 1

    def observe_outcome(self, outcome: RequestOutcome, batch: int) -> None:
        seconds = step_seconds(outcome)
        if seconds is not None:
            self.observe(outcome.speculation.k, batch, seconds)

    def line(self, bucket: int) -> tuple[float, float]:
        """(a_b, s_b) of a bucket: intercept and slope, prior-regularised."""
        cached = self._lines.get(bucket)
        if cached is not None:
            return cached
        data = self._sums.get(bucket, _Sums())
        level = data.st / data.n if data.n > 0 else self._level_elsewhere()
        kbar = data.sk / data.n if data.n > 0 else 0.0
        rel = self.prior_k_cost * (1.0 + bucket / self.prior_batch_saturation)
        a0 = level / (1.0 + rel * kbar)
        fit = _Sums(data.n, data.sk, data.skk, data.st, data.skt)
        half = self.prior_weight / 2.0
        # Symmetric about the data's mean k: the prior bends the slope, never the level.
        for k in (kbar - self.max_k / 2.0, kbar + self.max_k / 2.0):
            fit.add(k, a0 * (1.0 + rel * k), half)
        det = fit.n * fit.skk - fit.sk * fit.sk
        slope = a0 * rel if det <= 1e-12 else (fit.n * fit.skt - fit.sk * fit.st) / det
        slope = max(0.0, slope)
        intercept = max((fit.st - slope * fit.sk) / fit.n, 1e-9)
        self._lines[bucket] = (intercept, slope)
        return intercept, slope

    def _level_elsewhere(self) -> float:
        observed = [s.st / s.n for s in self._sums.values() if s.n > 0]
        return sum(observed) / len(observed) if observed else self.prior_step_s

    def relative_costs(self, batch: int) -> tuple[float, ...]:
        """cost(k, b) / cost(0, b) for k = 0..K."""
        bucket = batch_bucket(batch)
        cached = self._relative.get(bucket)
        if cached is None:
            intercept, slope = self.line(bucket)
            cached = tuple(1.0 + slope * k / intercept for k in range(self.max_k + 1))
            self._relative[bucket] = cached
        return cached

    def export_counters(self) -> dict[str, float]:
        """Raw (unforgotten) sums since the last export, as flat counters; resets them."""
        out: dict[str, float] = {}
        for bucket, sums in self._pending.items():
            for name in _FIELDS:
                out[f"{name}:b{bucket}"] = getattr(sums, name)
        self._pending.clear()
        return out

    def merge_counters(self, increments: Mapping[str, float]) -> None:
        """Add other replicas' sums (increments since the last merge)."""
        for name, value in increments.items():
            field_name, _, bucket_text = name.partition(":b")
            if field_name not in _FIELDS or not bucket_text.isdigit():
                continue
            bucket = batch_bucket(int(bucket_text))
            sums = self._sums.setdefault(bucket, _Sums())
            setattr(sums, field_name, getattr(sums, field_name) + float(value))
            self._invalidate(bucket)
