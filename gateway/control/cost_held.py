"""What a step the engine's step rule holds at depth 0 costs, beside a step no one drafts in.

Under the step rule (`engine.step_rule`) a request whose class may draft votes, and a step
the rule holds at depth 0 while voters are in it is not the gateway's step at k = 0: the
drafter still runs its KV pass (Model Runner V2), or drafts one verified by none (the V1
runner, where a depth-0 step otherwise skips the drafter; `engine/vllm/draft_skip.py`), so
that a voter can draft in a later step. A step with no voter skips the drafter.

Filing both at depth 0 made k = 0 look dearer than it is to a class deciding whether to
vote (on the MoE-shaped twin profile at concurrency 16, three times as many requests voted
as with per-request depths, each making its steps pay the drafter; `python -m bench twin`),
and filing only the skipping ones left the rule pricing a hold at the skipping step's cost.
So the cost model files the held steps apart: classes decide on the step no one drafts in,
and the rule prices holding at 0 by these (`CostModel.step_table`).
"""

from __future__ import annotations

#: Held steps a bucket needs before its own mean replaces the step at depth 0 in the
#: rule's table (the first few may be a host's warm-up).
HELD_MIN_STEPS = 4


class HeldSteps:
    """Per batch bucket, the forgetting mean of held steps' seconds."""

    def __init__(self, forgetting: float) -> None:
        self._keep = 1.0 - forgetting
        #: bucket -> (weight, weighted seconds, steps filed)
        self._sums: dict[int, tuple[float, float, int]] = {}

    def file(self, bucket: int, seconds: float) -> None:
        if seconds <= 0.0:
            return
        weight, total, count = self._sums.get(bucket, (0.0, 0.0, 0))
        keep = self._keep
        self._sums[bucket] = (weight * keep + 1.0, total * keep + seconds, count + 1)

    def mean(self, bucket: int) -> float | None:
        """Seconds of a held step in this bucket, None before HELD_MIN_STEPS."""
        weight, total, count = self._sums.get(bucket, (0.0, 0.0, 0))
        return total / weight if count >= HELD_MIN_STEPS else None
