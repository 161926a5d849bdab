"""One row of `GET /admin/classes`: what the controller knows about a class."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ClassReport:
    class_id: str
    label: str
    #: Requests seen, this replica's and merged ones.
    samples: int
    #: Mean acceptance length (bonus token included) over the sliding window.
    acceptance_length: float
    acceptance_length_ci: tuple[float, float]
    acceptance_length_ewma: float | None
    #: p_d = P(accept position d | accepted d-1), d = 1..K, as the policy uses it.
    depth_profile: tuple[float, ...]
    #: Verify steps that tried each draft position d = 1..K, this replica's and merged
    #: ones, over the class's life. 0 at d: p_d is the prior's or, after a cold start
    #: `like` another class (`reason`), that class's, never measured here (a class held
    #: at k = 0, by its policy or a batch-mate's floor, runs no drafts to measure).
    depth_trials: tuple[int, ...]
    #: Current k at the most recent batch bucket, and per bucket.
    k: int
    k_by_batch: dict[int, int]
    reason: str
    #: `stable`, or `drift up` / `drift down` with the count of drifts.
    drift_state: str
    drifts: int
    drift_statistic: float
    explored: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["k_by_batch"] = {str(b): k for b, k in self.k_by_batch.items()}
        out["acceptance_length_ci"] = list(self.acceptance_length_ci)
        out["depth_profile"] = list(self.depth_profile)
        out["depth_trials"] = list(self.depth_trials)
        return out

    @property
    def measured_positions(self) -> int:
        """`measured_positions` of its `depth_trials`."""
        return measured_positions(self.depth_trials)


def measured_positions(depth_trials: Sequence[float]) -> int:
    """The leading draft positions with verify steps of the class's own: position d is
    tried only after d - 1 was accepted, so the tried ones run from position 1 without a
    gap (0: the whole profile is a prior's or a similar class's)."""
    for d, trials in enumerate(depth_trials):
        if trials <= 0:
            return d
    return len(depth_trials)
