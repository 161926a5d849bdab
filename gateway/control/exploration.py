"""Exploration: which requests run at another depth than their class's k, and at which.

A class learns the acceptance only of the depths it runs, and the cost model the
price only of the depths batches run at, so a bounded share of requests probes.
For a request of a class whose k at batch bucket b is k (`ClassState.adaptive_k`):

1. Its share s is `exploration_share` (5 %; the class's `exploration-share` flag
   where set). A class at k = 0 learns only from its probes: s is raised to
   `zero_probe_share` (20 %) while k = 1 could still pay with p_1 at its upper
   bound (`may_pay_at_one`); where even that cannot pay, its probes only watch for
   a drift up. At batch 1, where each probe costs only its own request the draft,
   they spend at most `watch_probe_budget` (0.25 %) of the class's goodput: s is that
   budget over what a probe at k = 1 costs its request on the estimate's mean, at
   least `watch_probe_scale` (0.5) times s and at most `zero_probe_share` (a class
   that loses 2.5 % at k = 1 watches at 10 %, one that loses 20 % at 2.5 %; the rarer
   the probes, the longer a recovery goes unseen). While a probe's acceptance has put
   the class's upward drift statistic past `drift.EXCURSION` (1 sigma), short of an
   alarm, it watches at `zero_probe_share`: the next probes come within a few requests
   and confirm the recovery or clear the excursion, instead of one each few tens of
   requests (a variable sampling interval). Above batch 1 s is 0 (the probe
   would make every batch-mate draft and would prefill its prompt cold, outside the
   k = 0 cache namespace, `engine.vllm.scheduler`).
2. s is per batch, s / b: a probe deeper than its batch makes the drafter draft
   for every request in it.
3. Thin depths first (`thin_depths`): depths run fewer than `cost_min_samples`
   times at b, k = 0 included, or at b = 1 a stale k = 0 (no engine step at it in
   the bucket's last `STALE_STEPS`). While one lies within the flag bounds and is
   not k, s is at least `cost_probe_share` (20 %, not divided by b: a short
   calibration per bucket) and the probe runs at one of them, drawn at random.
   Above batch 1 only thin depths up to k + 1 count: a deeper probe makes every
   batch-mate draft that deep for its life (at batch 64 of an MoE target a k = 7
   step costs 7x one at k = 0) to price a depth the class reaches only through
   k + 1, which is then measured in turn.
4. Where the class's estimate favours a deeper depth than k but its evidence does
   not yet carry the move past the policy's margin (`Choice.reach`: the positions
   past k were run only by probes, so their spread keeps the margin at the full
   hysteresis), s is at least `zero_probe_share` and the probe runs at that depth
   (above batch 1 at k + 1 only, as in 3): the evidence that settles the question
   arrives within tens of requests, where k +- 1 probes at `exploration_share` took
   hundreds on a flat optimum (`python -m bench twin`, the settling table).
5. Else it runs at k - 1 or k + 1 (within the bounds), drawn at random.
6. Never past a guarded batch-mate's floor (`BatchDepth.floor`): where the probe's
   depth would cost a request in flight its `batch-floor`, the request is not a probe.

s = 0 (the flag at 0) turns all of it off, the thin-depth calibration included.
Randomness comes from the controller's injected `random.Random`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from gateway.control.cost_model import CostModel, batch_bucket
from gateway.control.decision import LoadSnapshot
from gateway.control.depth_profile import DepthProfile
from gateway.control.policies.base import Policy, PolicyInput
from gateway.control.settings import ControllerSettings

#: `BatchDepth.floor`: (load, bucket, depth, k_min) -> the deepest depth <= `depth` at
#: which every guarded request in flight keeps its floor.
Floor = Callable[[LoadSnapshot, int, int, int], int]


def may_pay_at_one(policy: Policy, inp: PolicyInput, prior_strength: float) -> bool:
    """Whether the policy scores k = 1 above k = 0 with position 1's acceptance at its
    upper bound (`Policy.score`, on `inp` with p_1 raised).

    The bound is two standard deviations of the posterior mean over the position's
    trials plus the prior's `prior_strength` pseudo-trials. A probe from k = 0 costs
    (its first token dearer, no prefix-cache hit from the class's k = 0 runs, every
    batch-mate drafting), so a class whose measured acceptance cannot pay even at
    the bound probes only to watch for a drift (`Exploration.probe`, batch 1 only).
    `inp.switch_steps` prices the prompt tokens the class's k = 0 runs find cached,
    which a k = 1 request prefills again outside their cache namespace.
    """
    profile = inp.profile
    if not profile.p or len(inp.relative_cost) < 2:
        return False
    p, n = profile.p[0], profile.trials[0] + prior_strength
    upper = min(1.0, p + 2.0 * math.sqrt(max(p * (1.0 - p), 0.01) / n))
    optimistic = PolicyInput(
        DepthProfile((upper,), (profile.trials[0],)),
        inp.samples,
        0,
        0,
        1,
        inp.since_change,
        inp.relative_cost[:2],
        inp.first_token[:2],
        inp.output_tokens,
        inp.switch_steps,
    )
    score = policy.score(optimistic)
    return len(score) > 1 and score[1] > score[0]


class Exploration:
    """The probes of `Controller.decide` (the module docstring's rule), over one cost model."""

    __slots__ = (
        "_calibrated",
        "_cost",
        "_floor",
        "_rng",
        "cost_min_samples",
        "cost_probe_share",
        "exploration_share",
        "watch_probe_budget",
        "watch_probe_scale",
        "zero_probe_share",
    )

    def __init__(
        self,
        cost: CostModel,
        settings: ControllerSettings,
        rng: random.Random,
        floor: Floor | None = None,
    ) -> None:
        self._cost = cost
        self._rng = rng
        self._floor = floor
        self.exploration_share = settings.exploration_share
        self.zero_probe_share = settings.zero_probe_share
        self.watch_probe_scale = settings.watch_probe_scale
        self.watch_probe_budget = settings.watch_probe_budget
        self.cost_probe_share = settings.cost_probe_share
        self.cost_min_samples = settings.cost_min_samples
        #: Per bucket: the largest `min_samples` every depth is known to meet. Run
        #: counts only grow, so once met it stays met and the decision path skips the scan.
        self._calibrated: dict[int, float] = {}

    def probe(
        self,
        k: int,
        hopeful: bool,
        k_bounds: tuple[int, int],
        bucket: int,
        load: LoadSnapshot,
        share: float | None = None,
        reach: int | None = None,
        watch_loss: float = 1.0,
        rising: bool = False,
    ) -> int | None:
        """The depth this request probes, or None (it runs at its class's k).

        `hopeful`: at k = 0, whether k = 1 could still pay (`may_pay_at_one`, kept per
        bucket by `ClassState`); `share`: the class's flag (None: `exploration_share`);
        `reach`: a deeper depth the class's estimate favours but its evidence does not
        yet carry (`Choice.reach`); `watch_loss`: at k = 0 where k = 1 cannot pay, what
        a probe at k = 1 costs its request (`BucketState.watch_loss`); `rising`: the
        class's drift detector reads an upward excursion (`DriftMonitor.rising`).
        """
        k_min, k_max = k_bounds
        if share is None:
            share = self.exploration_share
        if k == 0 and share > 0:
            if hopeful or (rising and bucket == 1):
                share = max(share, self.zero_probe_share)
            elif bucket > 1:
                share = 0.0
            else:
                share = self.watch_share(share, watch_loss)
        if reach is not None:
            # Above batch 1 no further than k + 1, as for the thin depths (step 3).
            reach = min(reach, k_max) if bucket == 1 else min(reach, k + 1, k_max)
            if share <= 0 or reach <= k:
                reach = None
            else:
                share = max(share, self.zero_probe_share)
        share /= bucket
        if share <= 0:
            return None
        # One draw per request either way; the thin depths (a scan of the cost model) are
        # looked up only when the draw could probe at all.
        draw = self._rng.random()
        if draw >= max(share, self.cost_probe_share):
            return None
        thin = self.thin_depths_in(bucket, self.cost_min_samples)
        if thin:
            deepest = k_max if bucket == 1 else min(k_max, k + 1)
            thin = [p for p in thin if k_min <= p <= deepest and p != k]
        if thin:
            share = max(share, self.cost_probe_share)
        if draw < share:
            if thin:
                probes = thin
            elif reach is not None:
                probes = [reach]
            else:
                probes = [p for p in (k - 1, k + 1) if k_min <= p <= k_max]
            if probes:
                probe = probes[0] if len(probes) == 1 else self._rng.choice(probes)
                floor = self._floor
                if not load.guarded or floor is None or floor(load, bucket, probe, k_min) == probe:
                    return probe
        return None

    def watch_share(self, share: float, loss: float) -> float:
        """The batch-1 share of a class at k = 0 whose probes only watch for a drift up:
        `watch_probe_budget` / `loss`, within [`watch_probe_scale` x `share`,
        `zero_probe_share`] (the module docstring, step 1)."""
        floor = share * self.watch_probe_scale
        budget = self.watch_probe_budget
        if budget <= 0.0:
            return floor
        return max(floor, min(self.zero_probe_share, budget / max(loss, 1e-9)))

    def thin_depths(self, batch: int, min_samples: float) -> list[int]:
        """Depths to measure at this load: run (as requests' own k) fewer than
        `min_samples` times ever, or, at batch 1, k = 0 once stale.

        Lifetime counts, not forgetting ones: a depth is calibrated once per bucket.
        Staleness is the second reason: the depths the traffic visits are priced by
        the host as it runs now, k = 0, which every relative cost divides by, by a
        calibration the host may have run at another speed. k +- 1 exploration
        already revisits the neighbours of a class's k, and a revisit prices them
        anew where their price moved (`cost_steps.REVISIT_CHECK`).
        """
        return self.thin_depths_in(batch_bucket(batch), min_samples)

    def thin_depths_in(self, bucket: int, min_samples: float) -> list[int]:
        """`thin_depths` for a bucket the caller already has (the decision path)."""
        cost = self._cost
        if min_samples <= self._calibrated.get(bucket, -1.0):
            stale = cost.stale_in(bucket)
            return list(stale) if stale else []
        row = cost.runs_in(bucket)
        if row is None:
            return list(range(cost.max_k + 1))
        thin = [k for k, n in enumerate(row) if n < min_samples]
        if not thin:
            self._calibrated[bucket] = min_samples  # larger than any bound met before
            return list(cost.stale_in(bucket))
        return thin
