"""Everything the controller holds for one live class, and its adaptive k per batch bucket.

The adaptive k is kept per batch bucket (load awareness): at a larger batch the
cost model can make a smaller k the better one, and each bucket has its own
hysteresis state so load swings do not reset what a quiet bucket learned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gateway.control.classify import RequestClass
from gateway.control.cost_model import CostModel
from gateway.control.decision import SpeculationDecision
from gateway.control.drift import DriftMonitor
from gateway.control.estimator import AcceptanceEstimator
from gateway.control.events import ControlEvents, DecisionChange
from gateway.control.exploration import may_pay_at_one
from gateway.control.policies import Policy, Situation
from gateway.control.stats import ClassStats

_NEVER = -(10**9)
#: `BucketState.capped` keys of raised decisions (`rides_at`): RIDE_KEY + depth, apart
#: from the held ones (depth, and -1 - depth for a floor).
RIDE_KEY = 1 << 16


def gains_at(expected: list[float], k: int) -> tuple[float, ...]:
    """E[tokens | min(k, D)] for D = 0..K: what a request at k yields in a batch at depth D."""
    k = min(k, len(expected) - 1)
    return tuple(expected[d if d < k else k] for d in range(len(expected)))


@dataclass(slots=True)
class BucketState:
    k: int
    changed_at: int = _NEVER
    #: (class version, cost version of the bucket, k_min, k_max) of the last evaluation.
    evaluated: tuple[int, int, int, int] = (-1, -1, -1, -1)
    #: The last unexplored decision made here, handed out again while k and the
    #: reason hold: a frozen dataclass costs more to build than the rest of `decide`.
    decision: SpeculationDecision | None = None
    #: E[tokens | min(k, D)] for D = 0..K as of the last evaluation (`SpeculationDecision.gains`).
    gains: tuple[float, ...] = ()
    #: Decisions held below k or raised above it for the batch (`Controller.decide`;
    #: keys: `held_at`, `rides_at`), for `capped_for`, the decision they stand in for.
    capped: dict[int, SpeculationDecision] = field(default_factory=dict)
    capped_for: SpeculationDecision | None = None
    #: At k = 0: whether k = 1 could still pay within the estimate's uncertainty
    #: (`Controller.decide` probes it at `zero_probe_share` only then).
    hopeful: bool = True
    #: At k = 0 where k = 1 cannot pay: the share of its goodput a request gives up by
    #: probing k = 1, on the estimate's mean (`Exploration.watch_share`); 1: unknown.
    watch_loss: float = 1.0
    #: A deeper depth the policy's estimate favours over k but holds back for want of
    #: evidence (`Choice.reach`): probed at `zero_probe_share`, so a class whose deeper
    #: positions were never run learns them within tens of requests, not through the
    #: k + 1 probes of `exploration_share` alone. None: no such depth.
    reach: int | None = None


@dataclass(slots=True)
class ClassState:
    cls: RequestClass
    estimator: AcceptanceEstimator
    drift: DriftMonitor
    initial_k: int
    reason: str
    pending: ClassStats
    buckets: dict[int, BucketState] = field(default_factory=dict)
    #: Requests observed (local); the clock of `min_dwell`.
    observed: int = 0
    #: Bumped whenever the evidence changes, so cached evaluations go stale.
    version: int = 0
    last_bucket: int = 1
    #: (k_min, k_max) of the last decision, so `refresh` can evaluate the next ones.
    last_bounds: tuple[int, int] | None = None
    #: Bit set of the buckets decided at from a cached evaluation since the last refresh.
    asked: int = 0
    drift_direction: int = 0
    explored: int = 0
    #: Estimate when the drift detector was last quiet (the "before" of a drift).
    stable_profile: tuple[float, ...] = ()
    stable_length: float | None = None

    def current_k(self) -> int:
        state = self.buckets.get(self.last_bucket)
        return state.k if state is not None else self.initial_k

    def adaptive_k(
        self,
        bucket: int,
        k_min: int,
        k_max: int,
        policy: Policy,
        cost: CostModel,
        events: ControlEvents,
    ) -> int:
        """The k at this bucket for a request being decided (the request path).

        The policy runs here only for a bucket the class has not been decided at,
        or when the flags moved the bounds (a k outside them must go at once).
        Otherwise the bucket's k from its last evaluation is handed out and the
        bucket is marked for `refresh`, which runs after the next response of the
        class (off the request path): new evidence reaches a bucket's k one
        response late, which hysteresis and the dwell make immaterial, and the
        request path stays a dict lookup (the decision path's budget is 20 us and a
        policy evaluation costs several: `bench/decision_latency.py`).
        """
        self.last_bucket = bucket
        self.last_bounds = (k_min, k_max)
        state = self.buckets.get(bucket)
        if state is None or state.evaluated[2] != k_min or state.evaluated[3] != k_max:
            return self._evaluate(bucket, k_min, k_max, policy, cost, events)
        self.asked |= bucket
        return state.k

    def refresh(self, policy: Policy, cost: CostModel, events: ControlEvents) -> None:
        """Re-evaluate the buckets decided at since the last refresh, if their evidence moved.

        Buckets are powers of two, so `asked` is a bit set of them.
        """
        if self.last_bounds is None:
            return
        k_min, k_max = self.last_bounds
        asked, self.asked = self.asked | self.last_bucket, 0
        while asked:
            bucket = asked & -asked
            asked ^= bucket
            self._evaluate(bucket, k_min, k_max, policy, cost, events)

    def _evaluate(
        self,
        bucket: int,
        k_min: int,
        k_max: int,
        policy: Policy,
        cost: CostModel,
        events: ControlEvents,
    ) -> int:
        """The policy's k at this bucket, re-evaluated only when evidence or bounds changed."""
        state = self.buckets.get(bucket)
        if state is None:
            state = self.buckets[bucket] = BucketState(self._nearest_k(bucket))
        key = (self.version, cost.bucket_version(bucket), k_min, k_max)
        if state.evaluated == key:
            return state.k
        state.evaluated = key
        at = Situation(
            self.cls.class_id,
            self.estimator,
            cost,
            bucket,
            state.k,
            k_min,
            k_max,
            self.observed - state.changed_at,
        )
        inp = policy.inputs(at)
        choice = policy.choose(inp)
        if choice.k != state.k:
            old, state.k, state.changed_at = state.k, choice.k, self.observed
            self.reason = choice.reason
            events.on_decision_change(
                DecisionChange(
                    self.cls.class_id,
                    self.cls.label,
                    bucket,
                    old,
                    choice.k,
                    choice.reason,
                    tuple(round(g, 4) for g in choice.goodput),
                )
            )
        state.reach = choice.reach if choice.k == state.k else None
        if state.k > 0:
            state.hopeful = True
        else:  # the probe from the k = 0 the policy chose: priced as leaving k = 0
            if at.current_k != 0:
                at.current_k = 0
                inp = policy.inputs(at)
            state.hopeful = may_pay_at_one(policy, inp, self.estimator.prior_strength)
            if not state.hopeful:
                score = policy.score(inp)
                paid = len(score) > 1 and score[0] > 0
                state.watch_loss = min(max(1.0 - score[1] / score[0], 0.0), 1.0) if paid else 1.0
        gains = gains_at(self.estimator.profile().expected_tokens(), state.k)
        old_gains = state.gains
        # Kept while within 5 %: a new tuple makes the next `decide` build its decision anew.
        if len(gains) != len(old_gains) or any(
            abs(g - o) > 0.05 * o for g, o in zip(gains, old_gains, strict=True)
        ):
            state.gains = gains
        return state.k

    def decision_at(self, bucket: int) -> SpeculationDecision:
        """The unexplored decision at a bucket `adaptive_k` has evaluated."""
        state = self.buckets[bucket]
        decision = state.decision
        if (
            decision is None
            or decision.k != state.k
            or decision.reason != self.reason
            or decision.gains is not state.gains
        ):
            cls = self.cls
            decision = SpeculationDecision(
                state.k, self.reason, False, cls.class_id, cls.label, bucket, gains=state.gains
            )
            state.decision = decision
        return decision

    def held_at(
        self, decision: SpeculationDecision, depth: int, floor: bool = False
    ) -> SpeculationDecision:
        """`decision` held at a smaller depth for its batch; cached like `decision_at`.

        `floor`: held for a batch-mate's `batch_floor`, not for the batch's tokens.
        """
        capped = self._capped_for(decision)
        key = -1 - depth if floor else depth
        held = capped.get(key)
        if held is None:
            why = (
                "keeps the requests in flight at their batch floor"
                if floor
                else "pays more for the requests in flight"
            )
            held = capped[key] = SpeculationDecision(
                depth,
                f"batch: k={depth}, not {decision.k}, {why}",
                False,
                decision.class_id,
                decision.label,
                decision.bucket,
                gains=decision.gains,
            )
        return held

    def rides_at(self, decision: SpeculationDecision, depth: int) -> SpeculationDecision:
        """`decision` raised to the batch's depth, which it pays for anyway; cached like
        `held_at`. Its gains are those of a request at `depth`; it anchors at its
        class's k (`BatchLoad.anchored`)."""
        capped = self._capped_for(decision)
        key = RIDE_KEY + depth
        ride = capped.get(key)
        if ride is None:
            ride = capped[key] = SpeculationDecision(
                depth,
                f"batch: rides at k={depth}, the depth the batch drafts anyway "
                f"(its class's k={decision.k})",
                False,
                decision.class_id,
                decision.label,
                decision.bucket,
                gains=gains_at(self.estimator.profile().expected_tokens(), depth),
                anchor=decision.k,
            )
        return ride

    def _capped_for(self, decision: SpeculationDecision) -> dict[int, SpeculationDecision]:
        """The bucket's cache of decisions moved from `decision` (held or raised), emptied
        when `decision` is no longer the one they stand in for."""
        state = self.buckets[decision.bucket]
        if state.capped_for is not decision:
            state.capped.clear()
            state.capped_for = decision
        return state.capped

    def probe(self, k: int, bucket: int) -> SpeculationDecision:
        """An exploration decision at depth k."""
        cls = self.cls
        gains = gains_at(self.estimator.profile().expected_tokens(), k)
        return SpeculationDecision(
            k, f"explore k={k}", True, cls.class_id, cls.label, bucket, gains=gains
        )

    def _nearest_k(self, bucket: int) -> int:
        """A new bucket starts from the k of the nearest known bucket (else the seed)."""
        if not self.buckets:
            return self.initial_k
        nearest = min(self.buckets, key=lambda b: abs(b.bit_length() - bucket.bit_length()))
        return self.buckets[nearest].k

    def allow_change_now(self) -> None:
        """After a drift: no dwell before the next change."""
        for state in self.buckets.values():
            state.changed_at = _NEVER
        self.version += 1
