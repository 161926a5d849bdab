"""First-token and prefill pricing: what a request pays once, before its decode steps.

Speculation makes the first token dearer: EAGLE prefills the drafter too and
drafts before the first token is out (at batch 1 a chat request's first token
took about 2x as long at any k >= 1 as at k = 0; `/admin/costs` after start-up
calibration shows the calibrated figures). For replies of a few dozen tokens
that decides whether speculation pays at all, and the step costs cannot see it
(they start after the first token).

`in_steps(b)` gives the seconds to the first token at each depth, in steps at
k = 0 of bucket b, from start-up calibration (the same prompt at every depth, so
the depths differ only in k): from the calibrated bucket nearest b (in powers of
two), a depth not measured there taking the nearest measured depth's. A deeper
first chain never costs less than a shallower one for the same prompt, so a
bucket's measured seconds are fitted non-decreasing in depth (least squares, pool
adjacent violators): calibration times each depth in a few rounds of a burst of b
requests, whose noise otherwise orders the depths at random (in the twin at batch
64, depth 5's first token read cheaper than depth 1's, and the step rule drafted
5 deep where 3 was best; `python -m bench twin`). Traffic does not refine it:
the prompts of the depths classes run at differ (long tool-call prompts at k = 0,
short chats deep), which would bias the difference more than it teaches.

`prefill_steps(b)`: one cold prompt token's prefill, in steps at k = 0 of b
(calibrated at batch 1), the price of prefilling again a prompt another cache
namespace holds.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.control.cost_steps import StepCosts


def non_decreasing(values: Sequence[float]) -> tuple[float, ...]:
    """The least-squares non-decreasing fit of `values` (pool adjacent violators)."""
    blocks: list[tuple[float, int]] = []  # (sum, count) of each pooled run
    for value in values:
        total, count = value, 1
        while blocks and blocks[-1][0] * count > total * blocks[-1][1]:
            prev_total, prev_count = blocks.pop()
            total, count = total + prev_total, count + prev_count
        blocks.append((total, count))
    return tuple(total / count for total, count in blocks for _ in range(count))


class FirstTokenPrices:
    """Calibrated seconds to the first token per (bucket, depth), and the cold prefill."""

    __slots__ = ("_in_steps", "_nearest", "_seconds", "max_k", "prefill_s")

    def __init__(self, max_k: int) -> None:
        self.max_k = max_k
        #: Per calibrated bucket: seconds to the first token at each depth (None: not measured).
        self._seconds: dict[int, list[float | None]] = {}
        #: Per bucket: `in_steps` as of the bucket's last refresh.
        self._in_steps: dict[int, tuple[float, ...]] = {}
        #: Per bucket: the calibrated seconds each depth borrows (`_borrowed`); they change
        #: only with calibration, while `in_steps` follows every refresh of the step at k = 0.
        self._nearest: dict[int, tuple[float, ...]] = {}
        #: Seconds to prefill one prompt token cold, at batch 1 (calibration); 0 = unknown.
        self.prefill_s = 0.0

    def calibrate(self, k: int, bucket: int, seconds: float) -> bool:
        """Record the seconds to the first token at depth k; whether it was recorded
        (every bucket's prices then change: those without calibration borrow)."""
        if not 0 <= k <= self.max_k or seconds <= 0:
            return False
        row = self._seconds.setdefault(bucket, [None] * (self.max_k + 1))
        row[k] = seconds
        self._in_steps.clear()
        self._nearest.clear()
        return True

    def calibrate_prefill(self, seconds_per_token: float) -> None:
        self.prefill_s = max(0.0, seconds_per_token)

    def forget(self, bucket: int) -> None:
        """Drop the bucket's cached prices: its step at k = 0 (their unit) moved."""
        self._in_steps.pop(bucket, None)

    def in_steps(self, bucket: int, steps: StepCosts) -> tuple[float, ...]:
        """Time to the first token at k = 0..K, in steps at k = 0 of this bucket (empty
        without calibration: the policy then weighs decode steps only)."""
        cached = self._in_steps.get(bucket)
        if cached is not None:
            return cached
        cached = ()
        if self._seconds:
            step0 = steps.step_zero(bucket)
            cached = tuple(s / step0 for s in self._borrowed(bucket))
        self._in_steps[bucket] = cached
        return cached

    def _borrowed(self, bucket: int) -> tuple[float, ...]:
        """Seconds to the first token at k = 0..K for this bucket: the calibrated bucket
        nearest it (in powers of two), fitted non-decreasing over its measured depths,
        each depth from the nearest measured depth there."""
        borrowed = self._nearest.get(bucket)
        if borrowed is None:
            near = min(self._seconds, key=lambda b: (abs(b.bit_length() - bucket.bit_length()), b))
            depths, seconds = zip(
                *((d, s) for d, s in enumerate(self._seconds[near]) if s is not None), strict=True
            )
            measured = list(zip(depths, non_decreasing(seconds), strict=True))
            borrowed = tuple(
                min(measured, key=lambda m: (abs(m[0] - d), m[0]))[1] for d in range(self.max_k + 1)
            )
            self._nearest[bucket] = borrowed
        return borrowed

    def prefill_steps(self, bucket: int, steps: StepCosts) -> float:
        """One cold prompt token's prefill in steps at k = 0 of this bucket (0: unknown)."""
        if self.prefill_s <= 0.0:
            return 0.0
        return self.prefill_s / steps.step_zero(bucket)
