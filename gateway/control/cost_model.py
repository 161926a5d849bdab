"""The step-cost model, learned online from measured engine step times: the facade.

What the policy reads per batch bucket b: the relative cost of a decode step at
each depth, cost(k, b) / cost(0, b), and the time to the first token at each
depth in steps at k = 0. Three jobs, one module each:

- `cost_steps`: filing step times (engine steps, else finished requests) at
  their batch's size and depth, the line and the per-depth means they fit;
- `cost_first_token`: the start-up calibration of the first token and of a cold
  prefill, priced in steps at k = 0;
- `cost_sharing`: the counters replicas exchange.

This facade keeps the version of each bucket's costs, which cached decisions
compare (`bucket_version`): it moves only when new samples shift one of the
bucket's costs by more than COST_TOLERANCE since the last move.
"""

from __future__ import annotations

from collections.abc import Mapping

from engine.interface import RequestOutcome
from engine.step_rule import StepCostTable
from gateway.control import cost_sharing
from gateway.control.cost_first_token import FirstTokenPrices
from gateway.control.cost_held import HeldSteps
from gateway.control.cost_steps import (
    BUCKETS,
    MIXED_DEPTH,
    PREFILL_PER_STEP,
    RESTALE_BUCKETS,
    REVISIT_CHECK,
    REVISIT_WEIGHT,
    STALE_STEPS,
    STEP_OUTLIER,
    StepCosts,
    batch_bucket,
    step_seconds,
)

__all__ = [
    "BUCKETS",
    "COST_TOLERANCE",
    "MIXED_DEPTH",
    "PREFILL_PER_STEP",
    "RESTALE_BUCKETS",
    "REVISIT_CHECK",
    "REVISIT_WEIGHT",
    "STALE_STEPS",
    "STEPS_PER_REFRESH",
    "STEP_OUTLIER",
    "CostModel",
    "batch_bucket",
    "step_seconds",
]

#: A sample that moves no relative cost by more than this share leaves the bucket's
#: version alone: the policy's hysteresis (3 %) dwarfs it, and every version bump
#: makes each class re-run the policy (`bench/decision_latency.py` times the path).
COST_TOLERANCE = 0.01
#: Engine steps of a bucket between two recomputations of its costs: one step moves a
#: depth's mean by about `step_forgetting` of the gap, far below COST_TOLERANCE, and
#: a recomputation costs tens of microseconds, per step a share of a core.
STEPS_PER_REFRESH = 8


class CostModel:
    """Relative step costs and first-token prices per batch bucket, and their versions."""

    def __init__(
        self,
        max_k: int,
        prior_step_s: float,
        prior_k_cost: float,
        prior_batch_saturation: float,
        prior_weight: float,
        forgetting: float,
        step_forgetting: float = 0.002,
    ) -> None:
        self.max_k = max_k
        self._steps = StepCosts(
            max_k,
            prior_step_s,
            prior_k_cost,
            prior_batch_saturation,
            prior_weight,
            forgetting,
            step_forgetting,
        )
        self._first = FirstTokenPrices(max_k)
        self._held = HeldSteps(step_forgetting)
        #: Per bucket: bumped when its costs move; cached decisions compare it.
        self._bucket_versions: dict[int, int] = {}
        #: Per bucket: the relative costs, then first-token costs, at the last bump.
        self._versioned: dict[int, tuple[float, ...]] = {}
        #: The step-cost table and the bucket versions it was built at (`step_table`).
        self._table: tuple[tuple[int, ...], StepCostTable] | None = None

    # ---- evidence --------------------------------------------------------------------
    def observe(
        self, k: int, batch: int, seconds: float, depth: float | None = None, clean: bool = True
    ) -> None:
        """File one request's seconds per step at its batch's depth (`depth`, else its
        own k; `StepCosts.observe`). Once the engine times its steps, a request only
        counts as a run at its k: the steps it ran in were filed one by one."""
        bucket = self._steps.observe(k, batch, seconds, depth, clean)
        if bucket is not None:
            self._refresh(bucket)

    def observe_outcome(
        self,
        outcome: RequestOutcome,
        batch: int,
        depth: float | None = None,
        prefill: int | None = None,
    ) -> None:
        """File one finished request; `prefill`: prompt tokens that entered its batch
        during its life (`BatchMeans.prefill`; `StepCosts.observe_outcome`)."""
        bucket = self._steps.observe_outcome(outcome, batch, depth, prefill)
        if bucket is not None:
            self._refresh(bucket)

    def observe_step(self, batch: int, depth: int, seconds: float) -> None:
        """File one engine step of `batch` decoding requests at batch depth `depth`.

        Each step is one sample, forgotten at `step_forgetting` per step of its own
        depth (steps come some hundred times as often as finished requests). The
        caller files only steps whose batch it knows (`ControlPlane.observe_step`).
        The bucket's costs are recomputed every STEPS_PER_REFRESH steps.
        """
        bucket = batch_bucket(batch)
        count = self._steps.file_step(bucket, depth, seconds)
        if count and (count % STEPS_PER_REFRESH == 0 or bucket not in self._versioned):
            self._refresh(bucket)

    def observe_held_step(self, batch: int, seconds: float) -> None:
        """File one step the engine's step rule held at depth 0 with voters in it
        (`gateway.control.cost_held`): not a depth-0 step, which the drafter skips."""
        self._held.file(batch_bucket(batch), seconds)

    def held_cost(self, bucket: int) -> float | None:
        """A held step's cost over the bucket's step at depth 0 (at least 1), None
        before the bucket has seen enough of them."""
        held = self._held.mean(bucket)
        if held is None:
            return None
        return max(1.0, held / self._steps.step_zero(bucket))

    def calibrate_first_token(self, k: int, batch: int, seconds: float) -> None:
        """Record the measured seconds to the first token at depth k and this batch size."""
        if self._first.calibrate(k, batch_bucket(batch), seconds):
            for known in list(self._versioned):
                self._refresh(known)

    def calibrate_prefill(self, seconds_per_token: float) -> None:
        """Record the measured seconds to prefill one prompt token that is not cached."""
        self._first.calibrate_prefill(seconds_per_token)

    @property
    def prefill_s(self) -> float:
        """Seconds to prefill one prompt token cold, at batch 1 (0 = unknown)."""
        return self._first.prefill_s

    # ---- prices ----------------------------------------------------------------------
    def line(self, bucket: int) -> tuple[float, float]:
        """(a_b, s_b) of a bucket: intercept and slope, prior-regularised."""
        return self._steps.line(bucket)

    def relative_costs(self, batch: int) -> tuple[float, ...]:
        """cost(k, b) / cost(0, b) for k = 0..K."""
        return self._steps.relative_costs_in(batch_bucket(batch))

    def relative_costs_in(self, bucket: int) -> tuple[float, ...]:
        """`relative_costs` for a bucket the caller already has (the decision path)."""
        return self._steps.relative_costs_in(bucket)

    def first_token(self, batch: int) -> tuple[float, ...]:
        """Time to the first token at k = 0..K, in steps at k = 0 of this bucket
        (`FirstTokenPrices.in_steps`; empty without calibration)."""
        return self._first.in_steps(batch_bucket(batch), self._steps)

    def step_table(self) -> StepCostTable:
        """Every bucket's relative decode costs and first-token prices, for the engine's
        step-depth rule (`engine.step_rule`); rebuilt only when a bucket's version or its
        held steps' cost moves. Depth 0 there is what holding the step at 0 costs: the
        held steps' cost where known (`gateway.control.cost_held`). The first-token
        prices are the first drafts' (`FirstTokenPrices.drafts_in_steps`): a step pays
        its newcomers' drafter prefill at any depth."""
        held = tuple(self.held_cost(b) for b in BUCKETS)
        versions = (*(self._bucket_versions.get(b, 0) for b in BUCKETS), *_rounded(held))
        if self._table is None or self._table[0] != versions:
            table = StepCostTable(
                BUCKETS,
                tuple(
                    _holding(self.relative_costs_in(b), h)
                    for b, h in zip(BUCKETS, held, strict=True)
                ),
                tuple(self._first.drafts_in_steps(b, self._steps) for b in BUCKETS),
            )
            self._table = (versions, table)
        return self._table[1]

    def prefill_steps(self, bucket: int) -> float:
        """One cold prompt token's prefill in steps at k = 0 of this bucket (0: unknown)."""
        return self._first.prefill_steps(bucket, self._steps)

    def bucket_version(self, bucket: int) -> int:
        """Bumped when new samples move this bucket's costs by more than COST_TOLERANCE.

        Compared with the costs at the last bump, not the last sample, so that small
        moves cannot add up unseen. A decision cached at one load stays valid while
        other buckets refit: an empty bucket's relative costs come from the prior
        alone (the borrowed level divides out).
        """
        return self._bucket_versions.get(bucket, 0)

    # ---- what exploration reads --------------------------------------------------------
    def runs_in(self, bucket: int) -> list[float] | None:
        """Requests ever run at each own k at this bucket (None: none yet)."""
        return self._steps.runs.get(bucket)

    def stale_in(self, bucket: int) -> tuple[int, ...]:
        """(0,) while k = 0 is stale at this bucket (batch 1 only: `RESTALE_BUCKETS`)."""
        return self._steps.stale.get(bucket, ())

    # ---- reports and sharing ---------------------------------------------------------
    def report(self) -> list[dict[str, object]]:
        """Each bucket with evidence: relative cost per k, requests ever run at each own k
        (`samples`), the forgetting weight of step times filed at each depth (`filed`),
        the time to the first token per k in steps at k = 0 (`first_token`), and
        `[0]` where exploration re-measures a stale k = 0 (`stale`, batch 1 only)."""
        steps = self._steps
        return [
            {
                "batch_bucket": bucket,
                "relative_cost": [round(c, 4) for c in self.relative_costs(bucket)],
                "samples": [int(n) for n in steps.runs.get(bucket, [])],
                "filed": [round(n, 3) for n, _ in steps.per_k.get(bucket, [])],
                "first_token": [round(f, 3) for f in self.first_token(bucket)],
                "stale": list(steps.stale.get(bucket, ())),
            }
            for bucket in sorted(steps.sums)
        ]

    def export_counters(self) -> dict[str, float]:
        """Raw (unforgotten) sums since the last export, as flat counters; resets them."""
        return cost_sharing.export_counters(self._steps)

    def merge_counters(self, increments: Mapping[str, float]) -> None:
        """Add other replicas' sums (increments since the last merge)."""
        for bucket in cost_sharing.merge_counters(self._steps, increments):
            self._refresh(bucket)

    def _refresh(self, bucket: int) -> None:
        """Recompute a bucket's costs now (off the request path); bump its version if they moved."""
        steps = self._steps
        steps.mark_stale(bucket)
        steps.relative.pop(bucket, None)
        self._first.forget(bucket)
        costs = self.relative_costs(bucket) + self.first_token(bucket)
        before = self._versioned.get(bucket)
        if (
            before is None
            or len(before) != len(costs)
            or any(abs(c - b) > COST_TOLERANCE * b for c, b in zip(costs, before, strict=True))
        ):
            self._versioned[bucket] = costs
            self._bucket_versions[bucket] = self._bucket_versions.get(bucket, 0) + 1


def _holding(relative: tuple[float, ...], held: float | None) -> tuple[float, ...]:
    """A bucket's row for the step rule: depth 0 priced as a held step where known."""
    return relative if held is None else (held, *relative[1:])


def _rounded(held: tuple[float | None, ...]) -> tuple[int, ...]:
    """Held costs in COST_TOLERANCE steps (-1: unknown), for the table's cache key."""
    return tuple(-1 if h is None else round(h / COST_TOLERANCE) for h in held)
