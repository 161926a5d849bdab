"""Step filing and fits: the seconds of one decode step at each depth and batch bucket.

A step's cost is its batch's, and its deepest request sets it: the drafter drafts
that deep for every request in the step (`gateway.control.batch_load`). So a
sample is filed at (its batch's size, its batch's largest k):

- an engine step (`file_step`), where the engine times its steps
  (`engine.vllm.step_clock`) and the gateway knows the step's batch;
- else a finished request's (e2e - ttft) / (decode_steps - 1) (`observe`), at the
  largest k of the batch it ran in averaged over its life; from the first engine
  step on, requests' means are no longer filed (they would file the steps twice).

Per batch bucket b (powers of two of the running batch) the samples fit a line
by weighted least squares,

    step_s(k, b) = a_b + s_b * k,

whose prior fixes only its *shape*: two pseudo-points of weight `prior_weight / 2`
at k = kbar -+ K/2 on the line through the bucket's mean (kbar, level) with
relative slope rel(b) = prior_k_cost * (1 + b / prior_batch_saturation), since
verifying batch x (k + 1) tokens turns compute bound as the batch grows.

The line is in turn only the prior of each depth's own cost. Measured step costs
are not linear in k (the first draft adds the drafter's fixed cost, later drafts
less, some k cross a kernel or cache threshold; `tests/control/test_cost_model.py`),
and a line fitted where a class runs extrapolates a too-cheap k = 0. So each depth
keeps its own forgetting mean, forgotten per sample *of that depth* (a depth the
traffic stops visiting keeps what was measured there), shrunk towards the line by
w = `prior_weight` pseudo-observations:

    cost(k, b) = (sum_t(k, b) + w * line(k, b)) / (n(k, b) + w).

The policy needs only cost(k, b) / cost(0, b) (`relative_costs_in`): units cancel.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.interface import RequestOutcome
from gateway.control.cost_shape import fitted_shape, is_measured, measured_shapes

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
#: Samples of a bucket between two refits of its line, once it has this many.
REFIT_EVERY = 16
#: A request whose batch's depth, averaged over its life, is farther than this from a
#: whole depth ran in batches of several depths; its step time is not filed at any.
MIXED_DEPTH = 0.1
#: A request whose batch took in more than this many prompt tokens per decode step per
#: request during its life measured other requests' prefill more than its own decode
#: steps; its step time is not filed at any depth.
PREFILL_PER_STEP = 2.0
#: An engine step longer than this many times its depth's current mean is filed at
#: that bound: one step is one sample among hundreds, so a single stall (a collection
#: pause, a first run of a new batch shape) of a second would otherwise move a 15 ms
#: mean by about 2 ms, more than the gap between two depths.
STEP_OUTLIER = 3.0
#: Samples a depth's mean needs before it bounds a step (`STEP_OUTLIER`).
STEP_OUTLIER_AFTER = 8.0
#: Engine steps of a bucket after which a depth none of them ran at is stale: its mean
#: was taken while the host may have run at another speed (a shared host's step times
#: move by a quarter within minutes), so dividing the visited depth's fresh mean by it
#: mixes two speeds. Once it is visited again and its first REVISIT_CHECK steps show
#: its price moved, its old samples weigh at most REVISIT_WEIGHT; at batch 1
#: exploration re-measures a stale k = 0.
STALE_STEPS = 1000
#: Steps of a stale depth visited again that decide whether its price moved (by more
#: than STALE_SHIFT of its old mean). Where it did not, the old samples keep their
#: weight: cut to one, a deep depth's price rested on a few dozen noisy steps and
#: flipped a class between two depths 5 % apart in goodput (the engine twin, measured
#: MoE profile at c4). With 5 % step noise the mean of 8 steps strays past 5 % about
#: once in 200 revisits.
REVISIT_CHECK = 8
#: At batch 1, k = 0 is stale only once a depth visited since its last step has moved
#: by more than this share of its mean then: the host changed speed. Where nothing
#: moved, its price still holds, and re-measuring it costs a probe's whole reply at
#: k = 0 (a third of the tokens per step of a good class at k = 4 on a GPU). A stale
#: depth visited again is tested against the same share (REVISIT_CHECK).
STALE_SHIFT = 0.05
#: Samples' weight a stale depth's old mean keeps when it is visited again.
REVISIT_WEIGHT = 1.0
#: Buckets where a stale k = 0 is marked for exploration: at batch 1 a probe's k is its
#: step's depth. In a larger batch the step runs at its deepest request's depth, so a
#: probe at k = 0 measures nothing there.
RESTALE_BUCKETS = frozenset({1})


def batch_bucket(batch: int) -> int:
    """Smallest power-of-two bucket >= batch, capped at the last one."""
    if batch <= 1:
        return 1
    return min(1 << (batch - 1).bit_length(), BUCKETS[-1])


def step_seconds(outcome: RequestOutcome) -> float | None:
    """Seconds per decode step of one request, or None when it says nothing."""
    if outcome.decode_steps >= 2 and outcome.e2e_s > outcome.ttft_s > 0:
        return (outcome.e2e_s - outcome.ttft_s) / (outcome.decode_steps - 1)
    if outcome.decode_steps >= 2 and outcome.tpot_s > 0 and outcome.output_tokens >= 2:
        return outcome.tpot_s * (outcome.output_tokens - 1) / (outcome.decode_steps - 1)
    return None


@dataclass(slots=True)
class Sums:
    """Weighted sums of (k, t) samples: what a least-squares line needs."""

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

    def forget_add(self, f: float, k: float, t: float) -> None:
        """`scale(f)` then `add(k, t)` in one call (the step path's; the same roundings)."""
        self.n = self.n * f + 1.0
        self.sk = self.sk * f + k
        self.skk = self.skk * f + k * k
        self.st = self.st * f + t
        self.skt = self.skt * f + k * t


#: Per bucket, per depth: [count, sum of step seconds].
DepthTables = dict[int, list[list[float]]]


class StepCosts:
    """Filed step times per bucket and depth, the line through them, the relative costs.

    The tables are public to `gateway.control.cost_sharing` (what is filed here since
    the last export, and what other replicas add) and to the `CostModel` facade.
    """

    def __init__(
        self,
        max_k: int,
        prior_step_s: float,
        prior_k_cost: float,
        prior_batch_saturation: float,
        prior_weight: float,
        forgetting: float,
        step_forgetting: float,
    ) -> None:
        self.max_k = max_k
        self.prior_step_s = prior_step_s
        self.prior_k_cost = prior_k_cost
        self.prior_batch_saturation = prior_batch_saturation
        self.prior_weight = prior_weight
        #: Per-request forgetting of finished requests' step times.
        self.forgetting = forgetting
        #: Per-sample forgetting of engine steps, at their own depth.
        self.step_forgetting = step_forgetting
        #: Set by the first engine step: requests' step times are no longer filed.
        self.steps_fed = False
        #: Per bucket: engine steps filed (`file_step`).
        self.steps: dict[int, int] = {}
        #: Per bucket, per depth: `steps` at the depth's last filed step (-1: none).
        self.last_step: dict[int, list[int]] = {}
        #: Per bucket in RESTALE_BUCKETS: (0,) while k = 0 is stale as of the last refresh.
        self.stale: dict[int, tuple[int, ...]] = {}
        #: Per bucket in RESTALE_BUCKETS: (k = 0's last step, each depth's mean then).
        self.anchor: dict[int, tuple[int, list[float]]] = {}
        #: (bucket, depth) -> [fresh steps, their seconds, the old mean] of a stale depth
        #: visited again, until REVISIT_CHECK steps decide whether its price moved.
        self.revisits: dict[tuple[int, int], list[float]] = {}
        self.sums: dict[int, Sums] = {}
        self.lines: dict[int, tuple[float, float]] = {}
        self.since_fit: dict[int, int] = {}
        #: Per bucket, per depth: forgetting count and sum of step seconds.
        self.per_k: DepthTables = {}
        #: Per bucket, per depth: requests run at that own k, ever (never forgotten).
        self.runs: dict[int, list[float]] = {}
        self.relative: dict[int, tuple[float, ...]] = {}
        #: Per bucket: seconds of a step at k = 0 (the unit of the first-token terms).
        self.step0: dict[int, float] = {}
        #: Filed since the last export (raw, unforgotten): the bucket's line sums, the
        #: per-depth tables, the runs per own k (`cost_sharing.export_counters`).
        self.pending: dict[int, Sums] = {}
        self.pending_k: DepthTables = {}
        self.pending_runs: dict[int, list[float]] = {}

    # ---- filing ----------------------------------------------------------------------
    def observe(
        self, k: int, batch: int, seconds: float, depth: float | None, clean: bool
    ) -> int | None:
        """File one request's seconds per step at its batch's depth (`depth`, else k).

        Returns the bucket whose costs are to be recomputed (None: nothing filed).
        A request whose batch changed depth during its life (a mean more than
        MIXED_DEPTH from a whole depth) is filed at none: split between the two
        nearest depths, such mixed steps pulled each depth's mean towards the
        other's. It still counts as a run at its own k (`runs`): a probe of k has
        been made whatever its batch ran at, and counting it there ends the
        probing. `clean` False (its steps carried much prefill of other requests)
        files it at no depth either.
        """
        bucket = batch_bucket(batch)
        if 0 <= k <= self.max_k:
            self.runs_row(bucket)[k] += 1.0
            self.runs_row(bucket, self.pending_runs)[k] += 1.0
        if self.steps_fed:
            return None
        at = float(k) if depth is None else min(max(depth, 0.0), float(self.max_k))
        self.file(bucket, at, seconds, clean and 0 <= k <= self.max_k, self.forgetting)
        return bucket

    def observe_outcome(
        self, outcome: RequestOutcome, batch: int, depth: float | None, prefill: int | None
    ) -> int | None:
        """File one finished request; `prefill`: prompt tokens that entered its batch
        during its life. Chunked prefill runs in the same steps as the decodes, so
        above PREFILL_PER_STEP prompt tokens per decode step per request its steps
        measured others' prefill and are filed at no depth. Returns `observe`'s bucket.
        """
        seconds = step_seconds(outcome)
        if seconds is None:
            return None
        clean = True
        if prefill:
            clean = prefill <= PREFILL_PER_STEP * max(outcome.decode_steps, 1) * max(batch, 1)
        return self.observe(outcome.speculation.k, batch, seconds, depth, clean)

    def file_step(self, bucket: int, depth: int, seconds: float) -> int:
        """File one engine step at batch depth `depth`; returns the bucket's step count
        (0: not filed).

        A step far above its depth's mean is filed at STEP_OUTLIER times that mean.
        A depth visited again after STALE_STEPS of the bucket's steps whose first
        REVISIT_CHECK steps moved from its old mean by more than STALE_SHIFT has its
        old samples' weight cut to REVISIT_WEIGHT, so that steps of the host as it
        runs now price it within a few dozen.
        """
        self.steps_fed = True
        if not (0 <= depth <= self.max_k and seconds > 0.0):
            return 0
        count = self.steps.get(bucket, 0) + 1
        self.steps[bucket] = count
        last = self.last_step.get(bucket)
        if last is None:
            last = self.last_step[bucket] = [-1] * (self.max_k + 1)
        table = self.per_k.get(bucket)
        check: list[float] | None = None
        if table is not None:
            row = table[depth]
            if last[depth] >= 0 and count - last[depth] > STALE_STEPS and row[0] > REVISIT_WEIGHT:
                self.revisits[bucket, depth] = [0.0, 0.0, row[1] / row[0]]
            if row[0] >= STEP_OUTLIER_AFTER:
                seconds = min(seconds, STEP_OUTLIER * row[1] / row[0])
            if self.revisits:
                check = self.revisits.get((bucket, depth))
        last[depth] = count
        self.file(bucket, float(depth), seconds, True, self.step_forgetting)
        if check is not None:
            self.revisited(bucket, depth, check, seconds)
        return count

    def revisited(self, bucket: int, depth: int, check: list[float], seconds: float) -> None:
        """One more fresh step of a stale depth visited again; at REVISIT_CHECK of them,
        where their mean moved from the old one by more than STALE_SHIFT, the old
        samples keep REVISIT_WEIGHT beside the fresh ones."""
        check[0] += 1.0
        check[1] += seconds
        if check[0] < REVISIT_CHECK:
            return
        del self.revisits[bucket, depth]
        fresh, old = check[1] / check[0], check[2]
        if abs(fresh / old - 1.0) > STALE_SHIFT:
            row = self.per_k[bucket][depth]
            row[0], row[1] = REVISIT_WEIGHT + check[0], REVISIT_WEIGHT * old + check[1]

    def file(
        self, bucket: int, at: float, seconds: float, per_depth: bool, forgetting: float
    ) -> None:
        """Add one step-time sample at depth `at` to the bucket's line and, when `at` is
        (within MIXED_DEPTH of) a whole depth and `per_depth`, to that depth's mean."""
        keep = 1.0 - forgetting
        sums = self.sums.get(bucket)
        if sums is None:
            sums = self.sums[bucket] = Sums()
        sums.forget_add(keep, at, seconds)
        pending_sums = self.pending.get(bucket)
        if pending_sums is None:
            pending_sums = self.pending[bucket] = Sums()
        pending_sums.forget_add(1.0, at, seconds)
        near = round(at)
        if per_depth and abs(at - near) <= MIXED_DEPTH:
            # Each depth forgets only as it gets news of its own: decayed by other
            # depths' samples, a depth the traffic no longer visits lost its
            # calibration and fell back to the line, whose prior slope is a GPU's.
            table = self.per_k.get(bucket) or self.depth_table(self.per_k, bucket)
            row = table[near]
            row[0] = row[0] * keep + 1.0
            row[1] = row[1] * keep + seconds
            table = self.pending_k.get(bucket) or self.depth_table(self.pending_k, bucket)
            pending = table[near]
            pending[0] += 1.0
            pending[1] += seconds
        # Refit after every sample while a bucket is young, then every REFIT_EVERY:
        # the line moves slowly (the per-depth means, recomputed every sample, carry news).
        since = self.since_fit.get(bucket, 0) + 1
        if sums.n < REFIT_EVERY or since >= REFIT_EVERY:
            since = 0
            self.lines.pop(bucket, None)
        self.since_fit[bucket] = since

    def depth_table(self, tables: DepthTables, bucket: int) -> list[list[float]]:
        table = tables.get(bucket)
        if table is None:
            table = tables[bucket] = [[0.0, 0.0] for _ in range(self.max_k + 1)]
        return table

    def runs_row(self, bucket: int, rows: dict[int, list[float]] | None = None) -> list[float]:
        rows = self.runs if rows is None else rows
        row = rows.get(bucket)
        if row is None:
            row = rows[bucket] = [0.0] * (self.max_k + 1)
        return row

    def mark_stale(self, bucket: int) -> None:
        """In RESTALE_BUCKETS: whether k = 0 is stale, i.e. it had no filed step in the
        last STALE_STEPS *and* some depth d stepped since has moved:
        |mean_d / mean_d(at k = 0's last step) - 1| > STALE_SHIFT. The means at k = 0's
        last step are kept at each refresh that finds it new (`anchor`)."""
        last = self.last_step.get(bucket)
        if last is None or bucket not in RESTALE_BUCKETS:
            return
        at = last[0]
        table = self.per_k.get(bucket)
        if at < 0 or table is None:
            self.stale[bucket] = ()
            return
        means = [t / n if n > 0 else 0.0 for n, t in table]
        anchor = self.anchor.get(bucket)
        if anchor is None or anchor[0] != at:
            self.anchor[bucket] = (at, means)
            self.stale[bucket] = ()
            return
        stale = self.steps.get(bucket, 0) - at > STALE_STEPS and any(
            last[d] > at and then > 0 and abs(now / then - 1.0) > STALE_SHIFT
            for d, (now, then) in enumerate(zip(means, anchor[1], strict=True))
        )
        self.stale[bucket] = (0,) if stale else ()

    # ---- fits ------------------------------------------------------------------------
    def line(self, bucket: int) -> tuple[float, float]:
        """(a_b, s_b) of a bucket: intercept and slope, prior-regularised."""
        cached = self.lines.get(bucket)
        if cached is not None:
            return cached
        data = self.sums.get(bucket, Sums())
        table = self.per_k.get(bucket)
        if table is not None and any(n > 0 for n, _ in table):
            # Fitted to the per-depth means, which forget per own sample: the line
            # keeps the calibrated shape while traffic sits at one depth.
            data = Sums()
            for d, (n, t) in enumerate(table):
                if n > 0:
                    data.add(d, t / n, n)
        level = data.st / data.n if data.n > 0 else self._level_elsewhere()
        kbar = data.sk / data.n if data.n > 0 else 0.0
        rel = self.prior_k_cost * (1.0 + bucket / self.prior_batch_saturation)
        a0 = level / (1.0 + rel * kbar)
        fit = Sums(data.n, data.sk, data.skk, data.st, data.skt)
        half = self.prior_weight / 2.0
        # Symmetric about the data's mean k: the prior bends the slope, never the level.
        for k in (kbar - self.max_k / 2.0, kbar + self.max_k / 2.0):
            fit.add(k, a0 * (1.0 + rel * k), half)
        det = fit.n * fit.skk - fit.sk * fit.sk
        slope = a0 * rel if det <= 1e-12 else (fit.n * fit.skt - fit.sk * fit.st) / det
        slope = max(0.0, slope)
        intercept = max((fit.st - slope * fit.sk) / fit.n, 1e-9)
        self.lines[bucket] = (intercept, slope)
        return intercept, slope

    def _level_elsewhere(self) -> float:
        observed = [s.st / s.n for s in self.sums.values() if s.n > 0]
        return sum(observed) / len(observed) if observed else self.prior_step_s

    def relative_costs_in(self, bucket: int) -> tuple[float, ...]:
        """cost(k, b) / cost(0, b) for k = 0..K (cached until the bucket's next refresh)."""
        cached = self.relative.get(bucket)
        if cached is None:
            intercept, slope = self.line(bucket)
            table = self.per_k.get(bucket)
            w = self.prior_weight
            prior = [intercept + slope * k for k in range(self.max_k + 1)]
            # A bucket not measured at every depth takes its shape from those that are
            # (a measured one keeps its own: the other buckets' shapes are not needed).
            shape = None
            if table is None or not is_measured(table):
                shape = fitted_shape(measured_shapes(self.per_k), bucket, self.max_k, table)
            if shape is not None:
                # Its level from the depths it has samples at, each read through the
                # shape (cost(0) = mean_k / shape_k), not from the prior slope's line.
                filed = sum(n for n, _ in table) if table is not None else 0.0
                zero = prior[0]
                if table is not None and filed > 0:
                    zero = sum(t / r for (_, t), r in zip(table, shape, strict=True)) / filed
                prior = [zero * r for r in shape]
            costs = [
                (table[k][1] + w * prior[k]) / (table[k][0] + w) if table is not None else prior[k]
                for k in range(self.max_k + 1)
            ]
            cached = tuple(c / costs[0] for c in costs)
            self.relative[bucket] = cached
            self.step0[bucket] = costs[0]
        return cached

    def step_zero(self, bucket: int) -> float:
        """Seconds of a step at k = 0 of this bucket (the unit of the first-token terms)."""
        self.relative_costs_in(batch_bucket(bucket))  # computes and caches `step0`
        return self.step0[bucket]
