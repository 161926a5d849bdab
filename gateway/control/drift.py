"""Change-point detection on a class's acceptance: two-sided Page-Hinkley.

The detector watches standardised residuals r_t = (observed - predicted) / sigma,
where the prediction comes from the class's depth profile *before* the outcome is folded in (so a
change of k by the policy or an exploration probe is not itself a "drift"). With
tolerance delta and threshold lambda (Page 1954; Hinkley 1971):

    up_t   = max(0, up_{t-1}   + r_t - delta)     alarm when up_t   > lambda
    down_t = max(0, down_{t-1} - r_t - delta)     alarm when down_t > lambda

(the CUSUM form of Page-Hinkley with a known zero mean). Two signals are watched
per class: accepted tokens per verify step against their expectation under the
depth profile (over the positions the class has evidence for), and the
acceptance rate at position 1, the entry most sensitive to a template or
system-prompt change.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Floor of the residual standard deviation (acceptance-length units), and the
#: EWMA rate of the noise estimate after the learning phase.
_MIN_SD = 0.05
_VAR_RATE = 0.05
#: A cumulative sum at or above this many sigmas is an excursion under way, short of
#: an alarm: the controller keeps the estimate from before it as a drift's "before",
#: and a class watching from k = 0 samples at the short interval while its upward sum
#: lies there (a variable-sampling-interval CUSUM: Reynolds, Amin and Arnold, "CUSUM
#: charts with variable sampling intervals", Technometrics 32(4), 1990).
EXCURSION = 1.0


@dataclass(slots=True)
class PageHinkley:
    """Two-sided Page-Hinkley (CUSUM form) on standardised residuals with zero mean.

    Residuals are divided by their running standard deviation (an EWMA of r^2,
    learned during the first `min_samples` and kept up to date afterwards), so
    delta and lambda are in units of sigma: the textbook CUSUM choice delta =
    0.5 sigma, lambda = 5 sigma gives an in-control run length of several hundred
    requests and detects a 2-sigma shift within a handful.
    """

    delta: float
    threshold: float
    min_samples: int
    up: float = 0.0
    down: float = 0.0
    samples: int = 0
    var: float = 0.0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, residual: float) -> int:
        """Feed one residual; +1 on an upward change, -1 on a downward one, else 0."""
        self.samples += 1
        sd = max(self.var**0.5, _MIN_SD)
        if self.samples <= self.min_samples:
            # Learn the noise level (Welford, around the running mean: the estimate is
            # still settling, so its bias must not count as noise); no alarm yet.
            step = residual - self.mean
            self.mean += step / self.samples
            self.m2 += step * (residual - self.mean)
            self.var = self.m2 / self.samples
            return 0
        z = residual / sd
        self.var += _VAR_RATE * (min(residual * residual, 9.0 * sd * sd) - self.var)
        self.up = max(0.0, self.up + z - self.delta)
        self.down = max(0.0, self.down - z - self.delta)
        if self.up > self.threshold:
            return 1
        if self.down > self.threshold:
            return -1
        return 0

    def reset(self) -> None:
        """Start over after a change point (the noise level is re-learned too)."""
        self.up = 0.0
        self.down = 0.0
        self.samples = 0
        self.var = 0.0
        self.mean = 0.0
        self.m2 = 0.0

    @property
    def statistic(self) -> float:
        """The larger of the two cumulative sums, in sigmas (0 = no evidence of change)."""
        return max(self.up, self.down)


@dataclass(slots=True)
class DriftMonitor:
    """Both detectors of one class and how often they fired."""

    length: PageHinkley
    first: PageHinkley
    drifts: int = 0
    #: The direction of the last alarm (+1 up, -1 down; 0: none yet).
    last: int = 0

    @classmethod
    def create(cls, delta: float, threshold: float, min_samples: int) -> DriftMonitor:
        return cls(
            PageHinkley(delta, threshold, min_samples),
            PageHinkley(delta, threshold, min_samples),
        )

    def update(self, length_residual: float | None, first_residual: float | None) -> int:
        """Feed the residuals of one request; the first non-zero direction, else 0."""
        direction = 0
        if length_residual is not None:
            direction = self.length.update(length_residual)
        if first_residual is not None:
            second = self.first.update(first_residual)
            direction = direction or second
        if direction:
            self.drifts += 1
            self.last = direction
            self.length.reset()
            self.first.reset()
        return direction

    @property
    def statistic(self) -> float:
        return max(self.length.statistic, self.first.statistic)

    @property
    def rising(self) -> bool:
        """Whether acceptance is moving up: an upward excursion under way (`EXCURSION`,
        above the estimate by more than the tolerance, not yet to an alarm), or an
        upward alarm whose detectors are still learning the noise anew, when they can
        say nothing of the change going on."""
        if max(self.length.up, self.first.up) >= EXCURSION:
            return True
        return self.last > 0 and self.length.samples < self.length.min_samples
