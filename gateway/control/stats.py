"""Additive sufficient statistics of one class's speculation outcomes.

Everything here is a sum, so replicas can push deltas and add them up (`gateway.state`)
and a window is a scaled copy. Per position d (1-based in the docs, 0-based in
the lists) the statistics keep `accepted[d]`, the verify steps whose draft
position d was accepted, and `trials[d]`, the steps in which position d was
drafted *and* every earlier position was accepted; their ratio is the depth
profile p_d = P(accept d | accepted d-1) (see `depth_profile`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.interface import RequestOutcome, SpeculationOutcome

_SCALARS = ("requests", "steps", "accepted", "drafted", "output_tokens")


def position_counts(spec: SpeculationOutcome, positions: int) -> tuple[list[int], list[int]]:
    """(accepted, trials) per draft position of one request, at most `positions` long.

    With `tried_per_position` (the joint count) the trials are exact. Without it they
    are bounded by the marginals: min(accepted at d - 1, drafted at d), exact while every
    step drafted the same depth, too many where the depth moved between steps (steps
    that accepted d - 1 at depth d - 1 never tried d). Without `drafted_per_position`
    every verify step is taken to have drafted all k positions (vLLM drafts k tokens
    per step unless the request is about to end).
    """
    depth = min(max(spec.k, len(spec.accepted_per_position)), positions)
    accepted = [0] * depth
    trials = [0] * depth
    tried = spec.tried_per_position
    if tried:
        for d in range(min(depth, len(tried))):
            trials[d] = tried[d]
            acc = spec.accepted_per_position[d] if d < len(spec.accepted_per_position) else 0
            accepted[d] = max(0, min(acc, tried[d]))
        return accepted, trials
    previous = spec.verify_steps
    for d in range(depth):
        if spec.drafted_per_position:
            drafted = spec.drafted_per_position[d] if d < len(spec.drafted_per_position) else 0
        else:
            drafted = spec.verify_steps if d < spec.k else 0
        trial = max(0, min(previous, drafted))
        acc = spec.accepted_per_position[d] if d < len(spec.accepted_per_position) else 0
        acc = max(0, min(acc, trial))
        accepted[d] = acc
        trials[d] = trial
        previous = acc
    return accepted, trials


@dataclass(slots=True)
class ClassStats:
    """Sums over a class's finished requests; `add` and `scale` keep them mergeable."""

    positions: int
    requests: float = 0.0
    steps: float = 0.0
    accepted: float = 0.0
    drafted: float = 0.0
    output_tokens: float = 0.0
    accepted_at: list[float] = field(default_factory=list)
    trials_at: list[float] = field(default_factory=list)
    requests_at_k: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_at = _sized(self.accepted_at, self.positions)
        self.trials_at = _sized(self.trials_at, self.positions)
        self.requests_at_k = _sized(self.requests_at_k, self.positions + 1)

    def add_outcome(
        self,
        outcome: RequestOutcome,
        counts: tuple[list[int], list[int]] | None = None,
    ) -> None:
        """Add one request; `counts` = its `position_counts` when the caller has them."""
        spec = outcome.speculation
        self.requests += 1
        self.steps += spec.verify_steps
        self.accepted += spec.accepted_tokens
        self.drafted += spec.draft_tokens
        self.output_tokens += outcome.output_tokens
        self.requests_at_k[min(max(spec.k, 0), self.positions)] += 1
        accepted, trials = counts or position_counts(spec, self.positions)
        for d, (acc, trial) in enumerate(zip(accepted, trials, strict=False)):
            self.accepted_at[d] += acc
            self.trials_at[d] += trial

    def add(self, other: ClassStats, weight: float = 1.0) -> None:
        """Add another class's sums (a remote delta), optionally scaled."""
        self.requests += weight * other.requests
        self.steps += weight * other.steps
        self.accepted += weight * other.accepted
        self.drafted += weight * other.drafted
        self.output_tokens += weight * other.output_tokens
        for d in range(min(self.positions, other.positions)):
            self.accepted_at[d] += weight * other.accepted_at[d]
            self.trials_at[d] += weight * other.trials_at[d]
        for k in range(min(self.positions, other.positions) + 1):
            self.requests_at_k[k] += weight * other.requests_at_k[k]

    def scale(self, factor: float, positions: int | None = None) -> None:
        """Multiply every sum (exponential forgetting, or forgetting after a drift);
        `positions`: only the first that many positions' counts (None: all)."""
        self.requests *= factor
        self.steps *= factor
        self.accepted *= factor
        self.drafted *= factor
        self.output_tokens *= factor
        for d in range(self.positions if positions is None else min(positions, self.positions)):
            self.accepted_at[d] *= factor
            self.trials_at[d] *= factor
        for k in range(self.positions + 1):
            self.requests_at_k[k] *= factor

    def copy(self) -> ClassStats:
        out = ClassStats(self.positions)
        out.add(self)
        return out

    @property
    def acceptance_length(self) -> float:
        """vLLM's definition, bonus token included: 1 + accepted / verify steps."""
        return 1.0 + self.accepted / self.steps if self.steps > 0 else 1.0

    def to_counters(self) -> dict[str, float]:
        """Flat counters for Redis (`gateway.state`); zero entries are left out."""
        out = {name: getattr(self, name) for name in _SCALARS}
        for d in range(self.positions):
            out[f"acc:{d + 1}"] = self.accepted_at[d]
            out[f"trial:{d + 1}"] = self.trials_at[d]
        for k in range(self.positions + 1):
            out[f"req_k:{k}"] = self.requests_at_k[k]
        return {name: value for name, value in out.items() if value}

    @classmethod
    def from_counters(cls, counters: Mapping[str, float], positions: int) -> ClassStats:
        """Inverse of `to_counters`; unknown or out-of-range counters are ignored."""
        stats = cls(positions)
        for name, value in counters.items():
            if name in _SCALARS:
                setattr(stats, name, float(value))
                continue
            prefix, _, index = name.partition(":")
            if not index.isdigit():
                continue
            i = int(index)
            if prefix == "acc" and 1 <= i <= positions:
                stats.accepted_at[i - 1] = float(value)
            elif prefix == "trial" and 1 <= i <= positions:
                stats.trials_at[i - 1] = float(value)
            elif prefix == "req_k" and 0 <= i <= positions:
                stats.requests_at_k[i] = float(value)
        return stats

    def minus(self, other: ClassStats) -> ClassStats:
        """self - other, clamped at zero (increments between two remote totals)."""
        out = ClassStats(self.positions)
        out.add(self)
        out.add(other, -1.0)
        out.requests = max(0.0, out.requests)
        out.steps = max(0.0, out.steps)
        out.accepted = max(0.0, out.accepted)
        out.drafted = max(0.0, out.drafted)
        out.output_tokens = max(0.0, out.output_tokens)
        out.accepted_at = [max(0.0, v) for v in out.accepted_at]
        out.trials_at = [max(0.0, v) for v in out.trials_at]
        out.requests_at_k = [max(0.0, v) for v in out.requests_at_k]
        return out


def _sized(values: list[float], n: int) -> list[float]:
    return (list(values) + [0.0] * n)[:n]
