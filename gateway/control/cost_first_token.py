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
two). The first chain at depth k is the drafter's prefill, paid once at any k > 0,
and k drafter passes, so a bucket's measured seconds are fitted by least squares to

    f(k) = f(0) + j [k > 0] + s k,    j, s >= 0,

(`chain_fit`) and every depth, measured or not, reads the fit. Calibration times
each depth in a few rounds of a burst of b requests, and a burst's requests share
their first step, so each depth's median rests on a couple of independent draws:
at batch 64 on a GPU a draft adds a few hundredths of a step to the first token and
the rounds' noise some tenths. Read depth by depth (even fitted non-decreasing),
that noise set the depths' differences, and the step rule ran about a third of the
steps that admit newcomers at depth 1 where 3 was best (`python -m bench twin`,
measured-h100-llama8b-eagle3 at c64). With fewer than two depths above 0 measured,
or none at 0, the measured depths are fitted non-decreasing (least squares, pool
adjacent violators) and a depth not measured takes the nearest measured one's.
Traffic does not refine it: the prompts of the depths classes run at differ (long
tool-call prompts at k = 0, short chats deep), which would bias the difference
more than it teaches.

`prefill_steps(b)`: one cold prompt token's prefill, in steps at k = 0 of b
(calibrated at batch 1), the price of prefilling again a prompt another cache
namespace holds.
"""

from __future__ import annotations

import math
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


def chain_fit(depths: Sequence[int], seconds: Sequence[float]) -> tuple[float, float, float]:
    """(f(0), j, s) of `f(k) = f(0) + j [k > 0] + s k` fitted to (depth, seconds) by least
    squares with j, s >= 0 (the module docstring): the unconstrained fit where it is
    feasible, else the better of the fits with j = 0 or s = 0 (both, where neither
    alone is feasible). Needs depth 0 and two depths above it."""
    n = len(depths)
    best: tuple[float, float, float] | None = None
    best_sse = math.inf
    for free_j, free_s in ((True, True), (False, True), (True, False), (False, False)):
        columns = [[1.0] * n]
        if free_j:
            columns.append([1.0 if d > 0 else 0.0 for d in depths])
        if free_s:
            columns.append([float(d) for d in depths])
        coef = _least_squares(columns, seconds)
        if coef is None:
            continue
        a = coef[0]
        j = coef[1] if free_j else 0.0
        s = coef[-1] if free_s else 0.0
        if j < 0.0 or s < 0.0:
            continue
        fitted = (a + (j if d > 0 else 0.0) + s * d for d in depths)
        sse = sum((y - f) ** 2 for y, f in zip(seconds, fitted, strict=True))
        if free_j and free_s:
            return a, j, s  # feasible: the least-squares fit itself
        if sse < best_sse:
            best, best_sse = (a, j, s), sse
    assert best is not None  # the intercept alone always fits
    return best


def _least_squares(columns: list[list[float]], y: Sequence[float]) -> list[float] | None:
    """The coefficients of `y` on `columns` (normal equations, Gauss-Jordan), or None where
    they are singular."""
    m = len(columns)
    a = [[sum(p * q for p, q in zip(ci, cj, strict=True)) for cj in columns] for ci in columns]
    b = [sum(p * q for p, q in zip(ci, y, strict=True)) for ci in columns]
    for i in range(m):
        pivot = max(range(i, m), key=lambda r: abs(a[r][i]))
        if abs(a[pivot][i]) < 1e-12:
            return None
        a[i], a[pivot] = a[pivot], a[i]
        b[i], b[pivot] = b[pivot], b[i]
        for r in range(m):
            if r != i:
                f = a[r][i] / a[i][i]
                a[r] = [x - f * z for x, z in zip(a[r], a[i], strict=True)]
                b[r] -= f * b[i]
    return [b[i] / a[i][i] for i in range(m)]


class FirstTokenPrices:
    """Calibrated seconds to the first token per (bucket, depth), and the cold prefill."""

    __slots__ = ("_in_steps", "_nearest", "_seconds", "max_k", "prefill_s")

    def __init__(self, max_k: int) -> None:
        self.max_k = max_k
        #: Per calibrated bucket: seconds to the first token at each depth (None: not measured).
        self._seconds: dict[int, list[float | None]] = {}
        #: Per bucket: `in_steps` as of the bucket's last refresh.
        self._in_steps: dict[int, tuple[float, ...]] = {}
        #: Per bucket: the calibrated seconds each depth borrows, with the chain's jump and
        #: without it (`_borrowed`); they change only with calibration, while `in_steps`
        #: follows every refresh of the step at k = 0.
        self._nearest: dict[int, tuple[tuple[float, ...], tuple[float, ...]]] = {}
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
            cached = tuple(s / step0 for s in self._borrowed(bucket)[0])
        self._in_steps[bucket] = cached
        return cached

    def drafts_in_steps(self, bucket: int, steps: StepCosts) -> tuple[float, ...]:
        """`in_steps` less the chain's jump j at k > 0 (f(0) + s k): what the depth of a
        step that newcomers enter adds to it, for the step rule
        (`engine.step_rule.StepCostTable`, rebuilt only as costs move). The jump is the
        newcomers' drafter prefill, which such a step pays at any depth while a request
        in it drafts, at depth 0 too (held there, its voters keep their drafter KV).
        Where the depths were not fitted as a chain, `in_steps`."""
        if not self._seconds:
            return ()
        step0 = steps.step_zero(bucket)
        return tuple(s / step0 for s in self._borrowed(bucket)[1])

    def _borrowed(self, bucket: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """Seconds to the first token at k = 0..K for this bucket, with the chain's jump and
        without it: the calibrated bucket nearest it (in powers of two), its measured
        depths fitted (the module docstring)."""
        borrowed = self._nearest.get(bucket)
        if borrowed is None:
            near = min(self._seconds, key=lambda b: (abs(b.bit_length() - bucket.bit_length()), b))
            depths, seconds = zip(
                *((d, s) for d, s in enumerate(self._seconds[near]) if s is not None), strict=True
            )
            every = range(self.max_k + 1)
            if depths[0] == 0 and sum(1 for d in depths if d > 0) >= 2:
                a, j, s = chain_fit(depths, seconds)
                drafts = tuple(a + s * d for d in every)
                borrowed = (
                    tuple(f + (j if d > 0 else 0.0) for d, f in zip(every, drafts, strict=True)),
                    drafts,
                )
            else:
                measured = list(zip(depths, non_decreasing(seconds), strict=True))
                nearest = tuple(
                    min(measured, key=lambda m: (abs(m[0] - d), m[0]))[1] for d in every
                )
                borrowed = (nearest, nearest)
            self._nearest[bucket] = borrowed
        return borrowed

    def prefill_steps(self, bucket: int, steps: StepCosts) -> float:
        """One cold prompt token's prefill in steps at k = 0 of this bucket (0: unknown)."""
        if self.prefill_s <= 0.0:
            return 0.0
        return self.prefill_s / steps.step_zero(bucket)
