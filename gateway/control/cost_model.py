"""The step-cost model, learned online from measured engine step times.

Per batch-size bucket b (powers of two of the running batch) the seconds of one
decode step at depth k are fitted as a line, by weighted least squares over the
per-depth forgetting means of measured steps of finished requests (below):

    step_s(k, b) = a_b + s_b * k.

Where the engine times its steps (`engine.step_clock`), each decode step whose
batch the gateway knows is one sample at (its requests, the batch's largest k)
(`observe_step`). Otherwise one request contributes (d, (e2e - ttft) /
(decode_steps - 1)) once it has two or more decode steps, d being the largest k
of the batch it ran in, averaged over its life (its own k where the gateway does
not track its batch; see `gateway.control.batch_load`); in mixed traffic few
lives ran at one depth without other requests' prefill, so few may be filed and
the model stayed near its start-up calibration (concurrency 4, 2026-11-25).
The line's prior fixes only its *shape*, never the scale:
two pseudo-points of weight `prior_weight / 2` each at k = kbar -+ K/2 on the
line through the bucket's observed mean (kbar, level) with relative slope
rel(b) = prior_k_cost * (1 + b / prior_batch_saturation), since verification of
batch x (k + 1) tokens turns compute bound as the batch grows.

The line is in turn only the prior of the cost at each depth. Real step costs
are not linear in k: on CPU the first draft adds the drafter's fixed cost (its
KV-sync pass, a larger verify batch), later drafts much less, and some k cross
a kernel or cache threshold. A line fitted where a class runs (k = 3..4, say)
and extrapolated to k = 0 makes speculation look cheap. So each depth also keeps
its own forgetting mean (forgetting per sample *of that depth*, so a depth the
traffic stops visiting keeps what was measured there, start-up calibration
included), and the cost used is that mean shrunk towards the line by
`prior_weight` pseudo-observations:

    cost(k, b) = (sum_t(k, b) + w * line(k, b)) / (n(k, b) + w).

`thin_depths` names the depths with little evidence of their own, so that
exploration measures them (k = 0 included) before it probes k +- 1. The policy
only needs cost(k, b) / cost(0, b), so units cancel.

A request also pays once for its first token, and speculation makes that dearer:
EAGLE prefills the drafter too and drafts before the first token is out, so on
the 2-core CPU a chat request's first token took about 70 ms at any k >= 1
against about 32 ms at k = 0 (batch 1), and at concurrency 16 about 0.65 s
against 0.24 s (`bench/results/report_2026-11-24_batchcost.md`). For replies of
a few dozen tokens that decides whether speculation pays at all, and the step
costs cannot see it (they start after the first token). `first_token(b)` gives
the seconds to the first token at each depth, in steps at k = 0 of that bucket,
from start-up calibration (same prompt at every depth, so depths differ only in
k). Traffic does not refine them: its prompts differ between the depths classes
run at (long tool-call prompts at k = 0, short chats deep), which would bias the
difference more than it teaches.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.interface import RequestOutcome

BUCKETS: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_FIELDS = ("n", "sk", "skk", "st", "skt")
#: Samples of a bucket between two refits of its line, once it has this many.
REFIT_EVERY = 16
#: A request whose batch's depth, averaged over its life, is farther than this from a
#: whole depth ran in batches of several depths; its step time is not filed at any.
MIXED_DEPTH = 0.1
#: A request whose batch took in more than this many prompt tokens per decode step per
#: request during its life measured other requests' prefill more than its own decode
#: steps; its step time is not filed at any depth.
PREFILL_PER_STEP = 2.0
#: A sample that moves no relative cost by more than this share leaves the bucket's
#: version alone: the policy's hysteresis dwarfs it, and every version bump makes
#: each class re-run the policy on its next request (issue 5's 20 us budget).
COST_TOLERANCE = 0.01
#: Engine steps of a bucket between two recomputations of its costs: one step moves a
#: depth's mean by about `step_forgetting` of the gap, far below COST_TOLERANCE, and
#: a recomputation costs tens of microseconds, per step a share of a core.
STEPS_PER_REFRESH = 8
#: An engine step longer than this many times its depth's current mean is filed at
#: that bound: one step is one sample among hundreds, so a single stall (a collection
#: pause, a first run of a new batch shape) of a second would otherwise move a 15 ms
#: mean by about 2 ms, more than the gap between two depths.
STEP_OUTLIER = 3.0
#: Samples a depth's mean needs before it bounds a step (`STEP_OUTLIER`).
STEP_OUTLIER_AFTER = 8.0
#: Engine steps of a bucket after which a depth none of them ran at is stale: its mean
#: was taken on a host that may have changed speed since (this VM's steps move by a
#: quarter within minutes), so dividing the visited depth's fresh mean by it mixes two
#: sittings. Its old samples weigh at most REVISIT_WEIGHT once it is visited again,
#: and at batch 1 a stale k = 0 is re-measured (`thin_depths`).
STALE_STEPS = 1000
#: Samples' weight a stale depth's old mean keeps when it is visited again.
REVISIT_WEIGHT = 1.0
#: Buckets whose stale k = 0 exploration re-measures: at batch 1 a probe's k is its
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
class _Sums:
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


@dataclass(slots=True)
class CostModel:
    """Online weighted least squares of step time on k, one line per batch bucket."""

    max_k: int
    prior_step_s: float
    prior_k_cost: float
    prior_batch_saturation: float
    prior_weight: float
    forgetting: float
    #: Per-sample forgetting of engine steps (`observe_step`); `forgetting` is per request.
    step_forgetting: float = 0.002
    #: Set by the first engine step: requests' step times are no longer filed.
    _steps_fed: bool = False
    #: Per bucket: engine steps filed (`observe_step`), for STEPS_PER_REFRESH.
    _steps: dict[int, int] = field(default_factory=dict)
    #: Per bucket, per depth: `_steps` at the depth's last filed step (-1: none).
    _last_step: dict[int, list[int]] = field(default_factory=dict)
    #: Per bucket in RESTALE_BUCKETS: (0,) while k = 0 is stale as of the last refresh.
    _stale: dict[int, tuple[int, ...]] = field(default_factory=dict)
    _sums: dict[int, _Sums] = field(default_factory=dict)
    _pending: dict[int, _Sums] = field(default_factory=dict)
    _lines: dict[int, tuple[float, float]] = field(default_factory=dict)
    _relative: dict[int, tuple[float, ...]] = field(default_factory=dict)
    _since_fit: dict[int, int] = field(default_factory=dict)
    #: Per bucket, per depth k: [forgetting count, forgetting sum of step seconds].
    _per_k: dict[int, list[list[float]]] = field(default_factory=dict)
    _pending_k: dict[int, list[list[float]]] = field(default_factory=dict)
    #: Per bucket, per depth: requests run at that own k since the last export.
    _pending_seen: dict[int, list[float]] = field(default_factory=dict)
    #: Per bucket, per depth: samples ever seen (never forgotten), for `thin_depths`.
    _seen: dict[int, list[float]] = field(default_factory=dict)
    #: Per bucket: the largest `min_samples` every depth is known to meet. Lifetime
    #: counts only grow, so once met it stays met and the decision path skips the scan.
    _calibrated: dict[int, float] = field(default_factory=dict)
    #: Per bucket: bumped when its relative costs move; cached decisions compare it.
    _bucket_versions: dict[int, int] = field(default_factory=dict)
    #: Per bucket: the relative costs (then first-token costs) as of the last version bump.
    _versioned: dict[int, tuple[float, ...]] = field(default_factory=dict)
    #: Per calibrated bucket: seconds to the first token at each depth (None: not measured).
    _first_s: dict[int, list[float | None]] = field(default_factory=dict)
    #: Per bucket: seconds of a step at k = 0 (the unit of `first_token`).
    _step0: dict[int, float] = field(default_factory=dict)
    _first: dict[int, tuple[float, ...]] = field(default_factory=dict)
    #: Seconds to prefill one prompt token cold, at batch 1 (calibration); 0 = unknown.
    prefill_s: float = 0.0

    def observe(
        self, k: int, batch: int, seconds: float, depth: float | None = None, clean: bool = True
    ) -> None:
        """File one request's seconds per step at its batch's depth (`depth`, else k).

        A step's cost is set by the deepest request in its batch
        (`gateway.control.batch_load`), so the cost of depth d is learnt from
        requests whose batch ran at depth d. A request whose batch changed depth
        during its life (a mean more than MIXED_DEPTH from a whole depth) is filed at
        none: split between the two nearest depths, such mixed steps pulled each
        depth's mean towards the other's (concurrency 4, 2026-11-24: after two runs
        a step at k = 1 looked as cheap as one at k = 0, where start-up calibration
        had measured 1.45x and the static k = 1 runs about 2x). `thin_depths` still
        counts the request under its own k: a probe of k has been made whatever
        its batch ran at, and counting it there ends the probing. `clean` False (its
        steps carried much prefill of other requests, `observe_outcome`) files it
        at no depth either.

        Once the engine times its steps (`observe_step`), a request's mean over its
        life is no longer filed at all: the steps it ran in were, one by one.
        """
        bucket = batch_bucket(batch)
        if 0 <= k <= self.max_k:
            self._seen_row(bucket)[k] += 1.0
            self._seen_row(bucket, self._pending_seen)[k] += 1.0
        if self._steps_fed:
            return
        at = float(k) if depth is None else min(max(depth, 0.0), float(self.max_k))
        self._file(bucket, at, seconds, clean and 0 <= k <= self.max_k, self.forgetting)

    def observe_step(self, batch: int, depth: int, seconds: float) -> None:
        """File one engine step of `batch` decoding requests at batch depth `depth`.

        Each step is one sample, forgotten at `step_forgetting` per step of its own
        depth (steps come some hundred times as often as finished requests). The
        caller files only steps whose batch it knows: no prefill in them, and the
        requests and drafts the engine scheduled those the gateway has in flight
        (`InferenceService.observe_step`). A step far above its depth's mean is
        filed at `STEP_OUTLIER` times that mean. A depth visited again after
        STALE_STEPS of the bucket's steps first has its old samples' weight cut to
        REVISIT_WEIGHT, so that the new sitting's steps price it within a few dozen.
        """
        self._steps_fed = True
        if 0 <= depth <= self.max_k and seconds > 0.0:
            bucket = batch_bucket(batch)
            count = self._steps.get(bucket, 0) + 1
            self._steps[bucket] = count
            last = self._last_step.get(bucket)
            if last is None:
                last = self._last_step[bucket] = [-1] * (self.max_k + 1)
            table = self._per_k.get(bucket)
            if table is not None:
                row = table[depth]
                if (
                    last[depth] >= 0
                    and count - last[depth] > STALE_STEPS
                    and row[0] > REVISIT_WEIGHT
                ):
                    keep = REVISIT_WEIGHT / row[0]
                    row[0], row[1] = REVISIT_WEIGHT, row[1] * keep
                if row[0] >= STEP_OUTLIER_AFTER:
                    seconds = min(seconds, STEP_OUTLIER * row[1] / row[0])
            last[depth] = count
            refresh = count % STEPS_PER_REFRESH == 0 or bucket not in self._versioned
            self._file(bucket, float(depth), seconds, True, self.step_forgetting, refresh)

    def _file(
        self,
        bucket: int,
        at: float,
        seconds: float,
        per_depth: bool,
        forgetting: float,
        refresh: bool = True,
    ) -> None:
        """Add one step-time sample at depth `at` to the bucket's line and, when `at` is
        (within MIXED_DEPTH of) a whole depth and `per_depth`, to that depth's mean;
        recompute the bucket's costs if `refresh` (else they wait for a later sample)."""
        sums = self._sums.setdefault(bucket, _Sums())
        sums.scale(1.0 - forgetting)
        sums.add(at, seconds)
        self._pending.setdefault(bucket, _Sums()).add(at, seconds)
        near = round(at)
        if per_depth and abs(at - near) <= MIXED_DEPTH:
            # Each depth forgets only as it gets news of its own: decayed by other
            # depths' samples, a depth the traffic no longer visits lost its
            # calibration and fell back to the line, whose prior slope is a GPU's
            # (2026-11-24, concurrency 4: classes crept from k = 2 to 4).
            keep = 1.0 - forgetting
            row = self._depth_table(self._per_k, bucket)[near]
            row[0] = row[0] * keep + 1.0
            row[1] = row[1] * keep + seconds
            pending = self._depth_table(self._pending_k, bucket)[near]
            pending[0] += 1.0
            pending[1] += seconds
        # Refit after every sample while a bucket is young, then every REFIT_EVERY:
        # the line moves slowly (the per-depth means, recomputed every sample, carry news).
        since = self._since_fit.get(bucket, 0) + 1
        if sums.n < REFIT_EVERY or since >= REFIT_EVERY:
            since = 0
            self._lines.pop(bucket, None)
        self._since_fit[bucket] = since
        if refresh:
            self._refresh(bucket)

    def _depth_table(self, tables: dict[int, list[list[float]]], bucket: int) -> list[list[float]]:
        table = tables.get(bucket)
        if table is None:
            table = tables[bucket] = [[0.0, 0.0] for _ in range(self.max_k + 1)]
        return table

    def _seen_row(self, bucket: int, rows: dict[int, list[float]] | None = None) -> list[float]:
        rows = self._seen if rows is None else rows
        row = rows.get(bucket)
        if row is None:
            row = rows[bucket] = [0.0] * (self.max_k + 1)
        return row

    def _refresh(self, bucket: int) -> None:
        """Recompute a bucket's costs now (off the request path); bump its version if they moved."""
        last = self._last_step.get(bucket)
        if last is not None and bucket in RESTALE_BUCKETS:
            at = last[0]
            stale = at >= 0 and self._steps.get(bucket, 0) - at > STALE_STEPS
            self._stale[bucket] = (0,) if stale else ()
        self._relative.pop(bucket, None)
        self._first.pop(bucket, None)
        costs = self.relative_costs(bucket) + self.first_token(bucket)
        before = self._versioned.get(bucket)
        if (
            before is None
            or len(before) != len(costs)
            or any(abs(c - b) > COST_TOLERANCE * b for c, b in zip(costs, before, strict=True))
        ):
            self._versioned[bucket] = costs
            self._bucket_versions[bucket] = self._bucket_versions.get(bucket, 0) + 1

    def bucket_version(self, bucket: int) -> int:
        """Bumped when new samples move this bucket's relative costs by more than COST_TOLERANCE.

        Compared with the costs at the last bump, not the last sample, so that small
        moves cannot add up unseen.

        A decision cached at one load stays valid while other buckets refit: an
        empty bucket's relative costs come from the prior alone (the borrowed level
        divides out), so no bucket's relative costs read another's data.
        """
        return self._bucket_versions.get(bucket, 0)

    def observe_outcome(
        self,
        outcome: RequestOutcome,
        batch: int,
        depth: float | None = None,
        prefill: int | None = None,
    ) -> None:
        """File one finished request; `prefill`: prompt tokens that entered its batch
        during its life (`BatchMeans.prefill`).

        Chunked prefill runs in the same steps as the decodes, so a request that shared
        its life with long prompts measured their prefill (concurrency 4 on the CPU:
        k = 0 requests from 15 to 107 ms per step). Which requests do that follows
        the traffic (long tool-call and long-context prompts ran at k = 0), so such
        samples made k = 0 look as dear as k = 1; above PREFILL_PER_STEP prompt
        tokens per decode step per request they are filed at no depth.
        """
        seconds = step_seconds(outcome)
        if seconds is None:
            return
        clean = True
        if prefill:
            clean = prefill <= PREFILL_PER_STEP * max(outcome.decode_steps, 1) * max(batch, 1)
        self.observe(outcome.speculation.k, batch, seconds, depth, clean)

    def line(self, bucket: int) -> tuple[float, float]:
        """(a_b, s_b) of a bucket: intercept and slope, prior-regularised."""
        cached = self._lines.get(bucket)
        if cached is not None:
            return cached
        data = self._sums.get(bucket, _Sums())
        table = self._per_k.get(bucket)
        if table is not None and any(n > 0 for n, _ in table):
            # Fitted to the per-depth means, which forget per own sample: the line
            # keeps the calibrated shape while traffic sits at one depth.
            data = _Sums()
            for d, (n, t) in enumerate(table):
                if n > 0:
                    data.add(d, t / n, n)
        level = data.st / data.n if data.n > 0 else self._level_elsewhere()
        kbar = data.sk / data.n if data.n > 0 else 0.0
        rel = self.prior_k_cost * (1.0 + bucket / self.prior_batch_saturation)
        a0 = level / (1.0 + rel * kbar)
        fit = _Sums(data.n, data.sk, data.skk, data.st, data.skt)
        half = self.prior_weight / 2.0
        # Symmetric about the data's mean k: the prior bends the slope, never the level.
        for k in (kbar - self.max_k / 2.0, kbar + self.max_k / 2.0):
            fit.add(k, a0 * (1.0 + rel * k), half)
        det = fit.n * fit.skk - fit.sk * fit.sk
        slope = a0 * rel if det <= 1e-12 else (fit.n * fit.skt - fit.sk * fit.st) / det
        slope = max(0.0, slope)
        intercept = max((fit.st - slope * fit.sk) / fit.n, 1e-9)
        self._lines[bucket] = (intercept, slope)
        return intercept, slope

    def _level_elsewhere(self) -> float:
        observed = [s.st / s.n for s in self._sums.values() if s.n > 0]
        return sum(observed) / len(observed) if observed else self.prior_step_s

    def relative_costs(self, batch: int) -> tuple[float, ...]:
        """cost(k, b) / cost(0, b) for k = 0..K."""
        return self.relative_costs_in(batch_bucket(batch))

    def relative_costs_in(self, bucket: int) -> tuple[float, ...]:
        """`relative_costs` for a bucket the caller already has (the decision path)."""
        cached = self._relative.get(bucket)
        if cached is None:
            intercept, slope = self.line(bucket)
            table = self._per_k.get(bucket)
            w = self.prior_weight
            costs = [
                (table[k][1] + w * (intercept + slope * k)) / (table[k][0] + w)
                if table is not None
                else intercept + slope * k
                for k in range(self.max_k + 1)
            ]
            cached = tuple(c / costs[0] for c in costs)
            self._relative[bucket] = cached
            self._step0[bucket] = costs[0]
        return cached

    def calibrate_first_token(self, k: int, batch: int, seconds: float) -> None:
        """Record the measured seconds to the first token at depth k and this batch size."""
        bucket = batch_bucket(batch)
        if not 0 <= k <= self.max_k or seconds <= 0:
            return
        row = self._first_s.setdefault(bucket, [None] * (self.max_k + 1))
        row[k] = seconds
        self._first.clear()  # buckets without calibration borrow the nearest one's
        for known in list(self._versioned):
            self._refresh(known)

    def calibrate_prefill(self, seconds_per_token: float) -> None:
        """Record the measured seconds to prefill one prompt token that is not cached."""
        self.prefill_s = max(0.0, seconds_per_token)

    def prefill_steps(self, bucket: int) -> float:
        """One cold prompt token's prefill in steps at k = 0 of this bucket (0: unknown)."""
        if self.prefill_s <= 0.0:
            return 0.0
        return self.prefill_s / self._step_zero(bucket)

    def _step_zero(self, bucket: int) -> float:
        """Seconds of a step at k = 0 of this bucket (the unit of the first-token terms)."""
        self.relative_costs(bucket)  # computes and caches `_step0` with the costs
        return self._step0[bucket]

    def first_token(self, batch: int) -> tuple[float, ...]:
        """Time to the first token at k = 0..K, in steps at k = 0 of this bucket.

        From the calibrated bucket nearest this one (in powers of two); a depth not
        measured there takes the nearest measured depth's. Empty without calibration:
        the policy then weighs decode steps only.
        """
        bucket = batch_bucket(batch)
        cached = self._first.get(bucket)
        if cached is not None:
            return cached
        cached = ()
        if self._first_s:
            near = min(self._first_s, key=lambda b: (abs(b.bit_length() - bucket.bit_length()), b))
            row = self._first_s[near]
            measured = [(d, s) for d, s in enumerate(row) if s is not None]
            step0 = self._step_zero(bucket)
            cached = tuple(
                min(measured, key=lambda m: (abs(m[0] - d), m[0]))[1] / step0
                for d in range(self.max_k + 1)
            )
        self._first[bucket] = cached
        return cached

    def report(self) -> list[dict[str, object]]:
        """Each bucket with evidence: relative cost per k, requests ever run at each own k
        (`samples`), the forgetting weight of step times filed at each depth (`filed`),
        the time to the first token per k in steps at k = 0 (`first_token`), and
        `[0]` where exploration re-measures a stale k = 0 (`stale`, batch 1 only)."""
        return [
            {
                "batch_bucket": bucket,
                "relative_cost": [round(c, 4) for c in self.relative_costs(bucket)],
                "samples": [int(n) for n in self._seen.get(bucket, [])],
                "filed": [round(n, 3) for n, _ in self._per_k.get(bucket, [])],
                "first_token": [round(f, 3) for f in self.first_token(bucket)],
                "stale": list(self._stale.get(bucket, ())),
            }
            for bucket in sorted(self._sums)
        ]

    def thin_depths(self, batch: int, min_samples: float) -> list[int]:
        """Depths to measure at this load: run (as requests' own k) fewer than
        `min_samples` times ever, or, at batch 1, k = 0 once stale (no engine step at
        it in the bucket's last STALE_STEPS).

        Lifetime counts, not the forgetting ones, for the first: a depth is calibrated
        once per bucket. Staleness is the second: the depths the traffic visits are
        priced by this sitting's steps, k = 0, which every relative cost divides by,
        by a calibration that may have run on a slower or faster host (a test gateway
        calibrated while another process shared its cores kept tool calls at k = 2
        for 40 requests). k +- 1 exploration already revisits the neighbours of a
        class's k, and a revisit prices them in the current sitting (REVISIT_WEIGHT).
        """
        return self.thin_depths_in(batch_bucket(batch), min_samples)

    def thin_depths_in(self, bucket: int, min_samples: float) -> list[int]:
        """`thin_depths` for a bucket the caller already has (the decision path)."""
        if min_samples <= self._calibrated.get(bucket, -1.0):
            stale = self._stale.get(bucket)
            return list(stale) if stale else []
        row = self._seen.get(bucket)
        if row is None:
            return list(range(self.max_k + 1))
        thin = [k for k, n in enumerate(row) if n < min_samples]
        if not thin:
            self._calibrated[bucket] = min_samples  # larger than any bound met before
            return list(self._stale.get(bucket, ()))
        return thin

    def export_counters(self) -> dict[str, float]:
        """Raw (unforgotten) sums since the last export, as flat counters; resets them."""
        out: dict[str, float] = {}
        for bucket, sums in self._pending.items():
            for name in _FIELDS:
                out[f"{name}:b{bucket}"] = getattr(sums, name)
        for bucket, table in self._pending_k.items():
            for k, (n, t) in enumerate(table):
                if n:
                    out[f"kn{k}:b{bucket}"] = n
                    out[f"kt{k}:b{bucket}"] = t
        for bucket, row in self._pending_seen.items():
            for k, n in enumerate(row):
                if n:
                    out[f"ks{k}:b{bucket}"] = n
        self._pending.clear()
        self._pending_k.clear()
        self._pending_seen.clear()
        return out

    def merge_counters(self, increments: Mapping[str, float]) -> None:
        """Add other replicas' sums (increments since the last merge)."""
        touched: set[int] = set()
        for name, value in increments.items():
            field_name, _, bucket_text = name.partition(":b")
            if not bucket_text.isdigit():
                continue
            bucket = batch_bucket(int(bucket_text))
            if field_name in _FIELDS:
                sums = self._sums.setdefault(bucket, _Sums())
                setattr(sums, field_name, getattr(sums, field_name) + float(value))
            elif field_name[:2] in ("kn", "kt", "ks") and field_name[2:].isdigit():
                k = int(field_name[2:])
                if k > self.max_k:
                    continue
                if field_name[:2] == "ks":
                    self._seen_row(bucket)[k] += float(value)
                    continue  # probe counts: no cost to refresh
                column = 0 if field_name[:2] == "kn" else 1
                self._depth_table(self._per_k, bucket)[k][column] += float(value)
            else:
                continue
            touched.add(bucket)
        for bucket in touched:
            self._lines.pop(bucket, None)
            self._refresh(bucket)
