"""Live acceptance estimation of one class: forgetting counts, a window, an EWMA.

Decisions use the exponentially forgotten per-position counts: before each
request that speculated is added, its scalar sums and the counts of the positions it
tried are multiplied by (1 - alpha), so the effective window is about 1/alpha requests
that reached a position and a drift (see `drift`) can shrink it at once
by scaling the counts with `drift_keep`. Reports also carry the sliding-window
mean of per-request acceptance lengths with a normal 95 % interval
(mean +- 1.96 s / sqrt(n)) and an EWMA of the same series.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from engine.interface import RequestOutcome
from gateway.control.depth_profile import DepthProfile
from gateway.control.stats import ClassStats, position_counts


@dataclass(frozen=True, slots=True)
class EstimatorParams:
    positions: int
    alpha: float
    window: int
    prior_strength: float
    depth_decay: float


@dataclass(frozen=True, slots=True)
class Residuals:
    """Observed minus predicted for one request (None where it says nothing)."""

    length: float | None
    first: float | None


class AcceptanceEstimator:
    """Per-class estimates from finished requests and merged remote evidence."""

    def __init__(self, params: EstimatorParams, prior: Sequence[float]) -> None:
        self._params = params
        self.prior = tuple(prior)
        self.live = ClassStats(params.positions)
        self.total = ClassStats(params.positions)
        self.lengths: deque[float] = deque(maxlen=params.window)
        self.ewma_length: float | None = None
        #: Requests (local and merged) since the class appeared or last drifted.
        self.samples_since_reset = 0.0
        self._profile: DepthProfile | None = None

    def profile(self) -> DepthProfile:
        if self._profile is None:
            p = self._params
            self._profile = DepthProfile.estimate(
                self.live.accepted_at,
                self.live.trials_at,
                self.prior,
                p.prior_strength,
                p.depth_decay,
            )
        return self._profile

    @property
    def prior_strength(self) -> float:
        """Pseudo-trials of the Beta prior on each position."""
        return self._params.prior_strength

    def mean_output_tokens(self, default: float) -> float:
        """Mean reply length over the live (forgetting) counts, else `default`."""
        live = self.live
        return live.output_tokens / live.requests if live.requests > 0 else default

    def counts(self, outcome: RequestOutcome) -> tuple[list[int], list[int]]:
        """(accepted, trials) per position of one request, computed once per outcome."""
        return position_counts(outcome.speculation, self._params.positions)

    def residuals(self, outcome: RequestOutcome, counts: tuple[list[int], list[int]]) -> Residuals:
        """Residuals of an outcome against the current estimate (call before `observe`).

        `length`: accepted tokens per verify step minus their expectation given the
        trials, sum_d (accepted_d - p_d * trials_d) / steps, over the positions the
        class has real evidence for (more trials than the prior's pseudo-trials), so
        the first run at a new depth is not mistaken for a drift of the class.
        `first`: acceptance at position 1 minus p_1.
        """
        spec = outcome.speculation
        if spec.verify_steps <= 0 or spec.k <= 0:
            return Residuals(None, None)
        profile = self.profile()
        accepted, trials = counts
        known = self._params.prior_strength
        excess = 0.0
        for d, (acc, trial) in enumerate(zip(accepted, trials, strict=True)):
            if self.live.trials_at[d] <= known:
                break
            excess += acc - profile.p[d] * trial
        first = None
        if trials and trials[0] > 0 and self.live.trials_at[0] > known:
            first = accepted[0] / trials[0] - profile.p[0]
        return Residuals(excess / spec.verify_steps, first)

    def observe(
        self, outcome: RequestOutcome, counts: tuple[list[int], list[int]] | None = None
    ) -> None:
        counts = counts or position_counts(outcome.speculation, self._params.positions)
        if outcome.speculation.verify_steps > 0:
            # Forget per informative request only: at k = 0 nothing is learned, and
            # forgetting then would drift the estimate back to the prior and flap. And
            # per position only where this request tried it: the positions past the
            # class's k learn only from probes, and forgetting them with every request
            # at k kept their evidence at a few probes' worth, so the policy's margin
            # never fell below the full hysteresis for a deeper depth.
            tried = sum(1 for t in counts[1] if t > 0)
            self.live.scale(1.0 - self._params.alpha, tried)
        self.live.add_outcome(outcome, counts)
        self.total.add_outcome(outcome, counts)
        self.samples_since_reset += 1
        spec = outcome.speculation
        if spec.verify_steps > 0 and spec.k > 0:
            length = spec.acceptance_length
            self.lengths.append(length)
            a = self._params.alpha
            self.ewma_length = (
                length if self.ewma_length is None else a * length + (1 - a) * self.ewma_length
            )
        self._profile = None
        self.profile()  # computed here, off the decision path

    def merge(self, increment: ClassStats, cap_steps: float) -> None:
        """Fold other replicas' new evidence in, at most `cap_steps` verify steps of it."""
        if increment.requests <= 0 and increment.steps <= 0:
            return
        weight = min(1.0, cap_steps / increment.steps) if increment.steps > 0 else 1.0
        self.live.add(increment, weight)
        self.total.add(increment)
        self.samples_since_reset += weight * increment.requests
        self._profile = None

    def forget(self, keep: float) -> None:
        """After a drift: keep only `keep` of the live counts and restart window and EWMA."""
        self.live.scale(keep)
        recent = list(self.lengths)[-2:]
        self.lengths.clear()
        self.lengths.extend(recent)
        self.ewma_length = recent[-1] if recent else None
        self.samples_since_reset = 0.0
        self._profile = None

    def window_mean(self) -> tuple[float, float, float]:
        """Mean acceptance length over the window and its 95 % interval."""
        n = len(self.lengths)
        if n == 0:
            return 1.0, 1.0, 1.0
        mean = sum(self.lengths) / n
        if n < 2:
            return mean, mean, mean
        var = sum((x - mean) ** 2 for x in self.lengths) / (n - 1)
        half = 1.96 * math.sqrt(var / n)
        return mean, mean - half, mean + half
