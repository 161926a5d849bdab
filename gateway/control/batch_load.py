"""The batch in flight: what the requests in the engine ask of each step, and the
means a request leaves with.

A step's cost is its batch's, and the batch's deepest request sets it: the drafter
drafts that deep for every request in the step. So a request's seconds per step
say what a step at its batch's largest k cost, not what its own k costs (a k = 0
request among k = 2 ones pays about a k = 2 step; start-up calibration's step at
each depth and batch size is in `/admin/costs`).
For the requests the gateway has in the engine, `BatchLoad` keeps, in O(1) per
request and with no per-step work:

- their count and their largest k, integrated over time: each request leaves with
  the means over its own life (`BatchMeans`), and the cost model files its step
  time at that size and depth (`CostModel.observe`); where the engine times its
  steps, the same counts say which depth a step ran at (`step_tokens`, `deepest`);
- `gains`: summed over them, the tokens per step each would yield were the batch
  to run at depth D (its class's choice capped at D), so that a newcomer's k is
  weighed for the whole batch (`BatchDepth.held`, `BatchDepth.lower_for_batch`);
- `guarded`: those whose class has a `batch_floor`, by (gains at their own depth,
  floor), so that no newcomer takes them below their floor (`BatchDepth.floor`). A
  request verifies at most its own k whatever the batch drafts (per-request depths),
  so one held or lowered below its class's choice yields E[tokens | min(its k, D)]
  at batch depth D: held at k = 0, one token a step at every D. Weighed at its
  class's choice instead, a request held at 0 let the next newcomer draft deep
  beside it, and it paid the deep steps for one token each;
- `anchored`: the largest depth one of them *chose* for its class, at which a
  newcomer of a shallower class rides (it pays that depth anyway). Riders anchor
  at their class's k, never at a depth another rider holds, so a batch of riders
  comes down once the class that wanted the depth has left;
- `fixed`: those whose k an operator set, which no newcomer lowers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

#: Depths D the gain sums cover: 0..16, the controller's largest K.
SLOTS = 17


class Ticket(NamedTuple):
    k: int
    started: float
    #: The integrals of batch size and of the batch's largest k at `started`.
    size_area: float
    depth_area: float
    #: What the request added to `gains` (empty: one token per step at every depth).
    gains: tuple[float, ...] = ()
    #: Prompt tokens that had entered the engine when this request did (its own included).
    entered: int = 0
    #: Its class's `batch_floor` (0: none), filed in `guarded` while it is in flight.
    floor: float = 0.0
    #: Caps applied before it entered (`BatchLoad.cap`): the later ones lowered it.
    caps_seen: int = 0
    #: The depth its class chose (k, or less where it rides deeper: `anchored`).
    anchor: int = 0
    #: Its k is an operator's (a pin, static mode): counted in `fixed` while in flight.
    fixed: bool = False


class BatchMeans(NamedTuple):
    """Means over one request's life (the request itself included)."""

    size: float
    #: The batch's largest k.
    depth: float
    #: Prompt tokens of the requests that entered the engine during this one's life:
    #: their prefill ran in its steps and lengthened them.
    prefill: int = 0


def _tally(counts: dict[int, int], depth: int, step: int) -> int:
    """Add `step` requests at `depth` (a count at 0 is dropped); the deepest left, or 0."""
    count = counts.get(depth, 0) + step
    if count > 0:
        counts[depth] = count
    else:
        counts.pop(depth, None)
    return max(counts) if counts else 0


def own_gains(gains: tuple[float, ...], depth: int) -> tuple[float, ...]:
    """`gains` (expected tokens per step at each batch depth D) of a request that
    verifies at most `depth` drafts: E[tokens | min(depth, D)]."""
    last = len(gains) - 1
    if last <= depth:
        return gains
    cut = gains[depth]
    return gains[:depth] + (cut,) * (last - depth + 1)


def _lowered(counts: dict[int, int], depth: int) -> dict[int, int]:
    """`counts` with every request deeper than `depth` moved to `depth`."""
    kept = {d: n for d, n in counts.items() if d <= depth}
    kept[depth] = kept.get(depth, 0) + sum(n for d, n in counts.items() if d > depth)
    return kept


class BatchLoad:
    """In-flight requests' count and largest k, integrated over time."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._n = 0
        #: k -> requests in flight at that k.
        self._at: dict[int, int] = {}
        #: `step_tokens` of `_at`, kept until `_at` changes (None: to recompute).
        self._tokens: int | None = 0
        self._deepest = 0
        self._t = clock()
        self._size_area = 0.0
        self._depth_area = 0.0
        self._gains = [0.0] * SLOTS
        self._entered = 0
        self._guarded: dict[tuple[tuple[float, ...], float], int] = {}
        #: Depths the batch was lowered to (`cap`), in order; emptied with the batch.
        self._caps: list[int] = []
        #: depth its class chose -> requests in flight (a rider counts at its class's).
        self._anchors: dict[int, int] = {}
        self._anchored = 0
        self._fixed = 0

    def _advance(self) -> float:
        now = self._clock()
        if self._n > 0 and now > self._t:
            dt = now - self._t
            self._size_area += self._n * dt
            self._depth_area += self._deepest * dt
        self._t = now
        return now

    def _move(self, k: int, step: int) -> None:
        self._deepest = _tally(self._at, k, step)
        self._tokens = None

    def enter(
        self,
        k: int,
        gains: tuple[float, ...] = (),
        prompt_tokens: int = 0,
        floor: float = 0.0,
        anchor: int | None = None,
        fixed: bool = False,
    ) -> Ticket:
        """A request enters the engine at depth k; `gains[D]` is its expected tokens per
        step were the batch to run at depth D (beyond the tuple: its last value);
        `floor` its class's `batch_floor`; `anchor` the depth its class chose where
        it rides deeper than that (None: k); `fixed`: an operator set its k."""
        now = self._advance()
        self._n += 1
        self._move(k, 1)
        anchor = k if anchor is None else min(anchor, k)
        self._anchor(anchor, 1)
        self._add(gains, 1.0)
        self._entered += prompt_tokens
        if floor > 0.0:
            key = (own_gains(gains, k), floor)
            self._guarded[key] = self._guarded.get(key, 0) + 1
        self._fixed += fixed
        return Ticket(
            k,
            now,
            self._size_area,
            self._depth_area,
            gains,
            self._entered,
            floor,
            len(self._caps),
            anchor,
            fixed,
        )

    def _anchor(self, depth: int, step: int) -> None:
        self._anchored = _tally(self._anchors, depth, step)

    def cap(self, depth: int) -> None:
        """Every request in flight deeper than `depth` now runs at `depth` (the engine
        lowered them for a newcomer's floor: `engine.vllm.scheduler`); never raises one."""
        if self._deepest <= depth:
            return
        self._advance()
        self._at = _lowered(self._at, depth)
        self._tokens = None
        self._deepest = max(self._at)
        self._caps.append(depth)
        if self._guarded:
            guarded: dict[tuple[tuple[float, ...], float], int] = {}
            for (gains, floor), n in self._guarded.items():
                key = (own_gains(gains, depth), floor)
                guarded[key] = guarded.get(key, 0) + n
            self._guarded = guarded
        if self._anchored > depth:
            self._anchors = _lowered(self._anchors, depth)
            self._anchored = max(self._anchors)

    def _add(self, gains: tuple[float, ...], sign: float) -> None:
        totals = self._gains
        if not gains:
            for d in range(SLOTS):
                totals[d] += sign
            return
        last = len(gains) - 1
        for d in range(SLOTS):
            totals[d] += sign * gains[d if d < last else last]

    def leave(self, ticket: Ticket) -> BatchMeans:
        now = self._advance()
        span = now - ticket.started
        prefill = self._entered - ticket.entered
        if span <= 0:  # no time in flight: the batch as it stands
            means = BatchMeans(float(self._n), float(self._deepest), prefill)
        else:
            means = BatchMeans(
                (self._size_area - ticket.size_area) / span,
                (self._depth_area - ticket.depth_area) / span,
                prefill,
            )
        self._n = max(0, self._n - 1)
        k, anchor = ticket.k, ticket.anchor
        for capped in self._caps[ticket.caps_seen :]:
            k, anchor = min(k, capped), min(anchor, capped)
        self._move(k, -1)
        self._anchor(anchor, -1)
        self._fixed -= ticket.fixed
        if not self._n:
            self._caps.clear()
        if ticket.floor > 0.0:
            key = (own_gains(ticket.gains, k), ticket.floor)
            left = self._guarded.get(key, 0) - 1
            if left > 0:
                self._guarded[key] = left
            else:
                self._guarded.pop(key, None)
        if self._n:
            self._add(ticket.gains, -1.0)
        else:  # empty: no rounding left behind
            self._gains[:] = [0.0] * SLOTS
        return means

    @property
    def gains(self) -> list[float]:
        """Summed over the requests in flight: expected tokens per step at batch depth D.

        The live list, read on the request path without a copy; do not mutate.
        """
        return self._gains

    @property
    def in_flight(self) -> int:
        return self._n

    def step_tokens(self) -> int:
        """Tokens one decode step of every request in flight schedules: 1 + its k each.

        An engine step that scheduled exactly these (and these many requests) ran
        this batch at `deepest` (`InferenceService.observe_step`).
        """
        tokens = self._tokens
        if tokens is None:  # read every engine step; `_at` changes per request
            tokens = self._tokens = sum(n * (1 + d) for d, n in self._at.items())
        return tokens

    @property
    def deepest(self) -> int:
        """The largest k among the requests in flight (0 when none)."""
        return self._deepest

    @property
    def anchored(self) -> int:
        """The largest depth a request in flight chose for its class (0 when none):
        the depth a newcomer of a shallower class rides at."""
        return self._anchored

    @property
    def fixed(self) -> int:
        """Requests in flight whose k an operator set (a pin, static or shadow mode)."""
        return self._fixed

    @property
    def guarded(self) -> dict[tuple[tuple[float, ...], float], int]:
        """(gains at their own depth, floor) -> requests in flight with a `batch_floor`;
        live, do not mutate."""
        return self._guarded
