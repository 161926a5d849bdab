"""The controller facade: classify, decide, observe, report, share.

The gateway calls `classify` and `decide` on the request path (a few
microseconds; see `bench/decision_latency.py`) and `observe` once a request
has finished. `export_deltas` and `merge` are the hooks through which replicas
share evidence (`gateway.state`): deltas are additive sums, `merge` takes the other
replicas' cumulative totals and folds in what is new since the last merge.
Nothing here is global; randomness comes from the injected `random.Random`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine.interface import RequestOutcome
from gateway.control.batch_depth import BatchDepth
from gateway.control.class_state import ClassState
from gateway.control.classify import Classifier, RequestClass, similarity
from gateway.control.cost_model import CostModel, batch_bucket
from gateway.control.decision import (
    NO_OVERRIDES,
    ControlOverrides,
    LoadSnapshot,
    SpeculationDecision,
)
from gateway.control.drift import EXCURSION, DriftMonitor
from gateway.control.estimator import AcceptanceEstimator, EstimatorParams
from gateway.control.events import ControlEvents, DriftEvent, LoggingEvents
from gateway.control.exploration import Exploration
from gateway.control.features import RequestFeatures
from gateway.control.policies import Situation, make_policy
from gateway.control.report import ClassReport
from gateway.control.settings import ControllerSettings
from gateway.control.stats import ClassStats

#: Pseudo-class id under which the cost model's sums are shared.
COST_ID = "_cost"


@dataclass(frozen=True, slots=True)
class ControlDeltas:
    """What changed since the last export: class id -> counter -> increment, plus metadata."""

    counters: dict[str, dict[str, float]]
    meta: dict[str, dict[str, str]]
    outcomes: int


class Controller:
    def __init__(
        self,
        settings: ControllerSettings,
        *,
        max_depth: int | None = None,
        events: ControlEvents | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        s = self._s = settings
        self._cap = s.max_k if max_depth is None else min(s.max_k, max_depth)
        self._static_k = min(s.default_k, self._cap)
        self._events: ControlEvents = events or LoggingEvents()
        self._rng = rng or random.Random(0)
        self._policy = make_policy(s.policy, s)
        self._params = EstimatorParams(
            self._cap, s.ewma_alpha, s.window, s.prior_strength, s.depth_decay
        )
        self._cost = CostModel(
            self._cap,
            s.prior_step_s,
            s.prior_k_cost,
            s.prior_batch_saturation,
            s.cost_prior_weight,
            s.cost_forgetting,
            s.cost_step_forgetting,
        )
        self._batch = BatchDepth(self._cost, s.hysteresis)
        self._exploration = Exploration(self._cost, s, self._rng, self._batch.floor)
        self._classifier = Classifier(
            s.max_classes, s.class_idle_s, s.classify_cache_size, clock, self._evicted
        )
        self._states: dict[str, ClassState] = {}
        self._remote_seen: dict[str, ClassStats] = {}
        self._cost_seen: dict[str, float] = {}
        self._unclaimed: dict[str, tuple[ClassStats, int | None]] = {}
        self._outcomes = 0

    @property
    def settings(self) -> ControllerSettings:
        return self._s

    @property
    def cost_model(self) -> CostModel:
        return self._cost

    @property
    def exploration(self) -> Exploration:
        return self._exploration

    # ---- request path ----------------------------------------------------------------
    def classify(self, features: RequestFeatures) -> RequestClass:
        return self._classifier.classify(features)

    def decide(
        self,
        cls: RequestClass,
        load: LoadSnapshot,
        overrides: ControlOverrides | None = None,
    ) -> SpeculationDecision:
        """The k for one request: ops flags first, then its class's cached choice at
        this load (`ClassState.adaptive_k`; the policy itself runs after responses, in
        `observe`), a bounded probe (`Exploration.probe`), or that choice fitted to
        the batch in flight (`BatchDepth.fit`)."""
        o = overrides or NO_OVERRIDES
        cid, label = cls.class_id, cls.label
        bucket = batch_bucket(load.batch)
        if not o.enabled:
            return SpeculationDecision(0, "kill switch", False, cid, label, bucket)
        if o.pin_k is not None:
            k = min(max(o.pin_k, 0), self._cap)
            return SpeculationDecision(k, "pinned", False, cid, label, bucket, fixed=True)
        k_max = min(o.k_max, self._cap)
        k_min = min(max(o.k_min, 0), k_max)
        state = self._states.get(cid) or self._new_state(cls, bucket, k_min, k_max)
        k = state.adaptive_k(bucket, k_min, k_max, self._policy, self._cost, self._events)
        if o.mode != "adaptive":
            static = min(max(self._static_k, k_min), k_max)
            if o.mode == "static":
                return SpeculationDecision(static, "static", False, cid, label, bucket, fixed=True)
            return SpeculationDecision(
                static, "shadow", False, cid, label, bucket, shadow_k=k, fixed=True
            )
        if load.queued > 0 and k > k_min:
            lowered = self._under_queue(state, bucket, k, (k_min, k_max), load)
            if lowered < k:
                reason = f"queue: {load.queued} waiting"
                return SpeculationDecision(lowered, reason, False, cid, label, bucket)
        held = state.buckets[bucket]
        hopeful = k == 0 and held.hopeful
        probe = self._exploration.probe(
            k,
            hopeful,
            (k_min, k_max),
            bucket,
            load,
            o.exploration_share,
            held.reach,
            held.watch_loss,
            k == 0 and state.drift.rising,
        )
        if probe is not None:
            return state.probe(probe, bucket)
        return self._batch.fit(state, state.decision_at(bucket), k, (k_min, k_max), bucket, load, o)

    def _under_queue(
        self,
        state: ClassState,
        bucket: int,
        k: int,
        bounds: tuple[int, int],
        load: LoadSnapshot,
    ) -> int:
        """The class's k at this bucket, lowered by the policy where the requests waiting
        for admission make its extra step time cost more than it gains (`under_queue`)."""
        at = Situation(
            state.cls.class_id,
            state.estimator,
            self._cost,
            bucket,
            k,
            bounds[0],
            bounds[1],
            state.observed - state.buckets[bucket].changed_at,
        )
        return self._policy.under_queue(at, k, load.queued, load.batch)

    def observe_step(self, batch: int, depth: int, seconds: float) -> None:
        """One timed engine step of `batch` decoding requests at batch depth `depth`
        (`CostModel.observe_step`): the cost model's evidence once the engine sends it."""
        self._cost.observe_step(batch, depth, seconds)

    def observe_held_step(self, batch: int, seconds: float) -> None:
        """One timed engine step the step rule held at depth 0 with voters in it
        (`CostModel.observe_held_step`)."""
        self._cost.observe_held_step(batch, seconds)

    def observe(
        self,
        cls: RequestClass,
        decision: SpeculationDecision,
        outcome: RequestOutcome,
        load: LoadSnapshot,
    ) -> None:
        """Fold a finished request in: cost model, estimate, drift check.

        `load` is the load the request ran under (means over its life where the
        gateway tracks them, `gateway.control.batch_load`, else at its end); the
        cost model files its step time at that batch size and depth.
        """
        self._outcomes += 1
        self._cost.observe_outcome(outcome, load.batch, load.depth, load.prefill)
        state = self._states.get(cls.class_id)
        if state is None:
            return  # evicted while the request ran
        counts = state.estimator.counts(outcome)
        residuals = state.estimator.residuals(outcome, counts)
        if state.drift.statistic < EXCURSION:
            # No excursion under way: the "before" a later drift reports.
            state.stable_profile = state.estimator.profile().p
            state.stable_length = state.estimator.ewma_length
        state.estimator.observe(outcome, counts)
        state.pending.add_outcome(outcome, counts)
        self._policy.observe(cls.class_id, outcome)
        state.observed += 1
        state.version += 1
        state.explored += int(decision.explored)
        direction = state.drift.update(residuals.length, residuals.first)
        if direction:
            self._drifted(state, direction)
        # The new evidence may change the policy's answer: evaluate the buckets the
        # class was decided at now, after the response, so the next `decide` finds
        # them current instead of running the policy on the request path.
        state.refresh(self._policy, self._cost, self._events)

    # ---- classes ---------------------------------------------------------------------
    def _new_state(self, cls: RequestClass, bucket: int, k_min: int, k_max: int) -> ClassState:
        """A new class: seeded by a similar known class (its profile and k), else by the
        prior (`cold_start`: the policy's best k under it at this load, or `default_k`)."""
        s = self._s
        prior: tuple[float, ...] = (s.prior_accept,)
        k, reason = self._static_k, "cold start: default k"
        estimator = AcceptanceEstimator(self._params, prior)
        seed = self._similar(cls)
        if seed is not None:
            prior = seed.estimator.profile().p or prior
            estimator = AcceptanceEstimator(self._params, prior)
            k, reason = seed.current_k(), f"cold start: like {seed.cls.label}"
        elif s.cold_start == "prior":
            k, reason = self._prior_k(cls, estimator, bucket, k_min, k_max), "cold start: prior"
        state = ClassState(
            cls=cls,
            estimator=estimator,
            drift=DriftMonitor.create(s.drift_delta, s.drift_threshold, s.drift_min_samples),
            initial_k=k,
            reason=reason,
            pending=ClassStats(self._cap),
        )
        unclaimed = self._unclaimed.pop(cls.class_id, None)
        if unclaimed is not None:
            stats, remote_k = unclaimed
            state.estimator.merge(stats, s.merge_cap_steps)
            if remote_k is not None:
                state.initial_k = min(max(remote_k, 0), self._cap)
                state.reason = "warm start: shared state"
        self._states[cls.class_id] = state
        return state

    def _prior_k(
        self, cls: RequestClass, estimator: AcceptanceEstimator, bucket: int, k_min: int, k_max: int
    ) -> int:
        """argmax_k of the policy's score (`Policy.score`) under the prior at this bucket's
        measured costs; ties go to the shallower k."""
        at = Situation(cls.class_id, estimator, self._cost, bucket, k_max, k_min, k_max, 0)
        score = self._policy.score(self._policy.inputs(at))
        if len(score) <= k_min:
            return min(k_min, len(score) - 1)
        return max(range(k_min, len(score)), key=lambda d: (score[d], -d))

    def _similar(self, cls: RequestClass) -> ClassState | None:
        if cls.features is None:
            return None
        best: ClassState | None = None
        best_key = (self._s.similar_min_score - 1, 0.0)
        for state in self._states.values():
            other = state.cls.features
            samples = state.estimator.samples_since_reset
            if other is None or samples < self._s.min_samples:
                continue
            key = (similarity(cls.features, other), samples)
            if key[0] >= self._s.similar_min_score and key > best_key:
                best, best_key = state, key
        return best

    def _evicted(self, cls: RequestClass) -> None:
        self._states.pop(cls.class_id, None)
        self._policy.forget(cls.class_id)
        self._events.on_class_evicted(cls)

    def _drifted(self, state: ClassState, direction: int) -> None:
        est = state.estimator
        before_len = state.stable_length or 1.0
        before = state.stable_profile
        est.forget(self._s.drift_keep)
        state.drift_direction = direction
        state.allow_change_now()
        self._events.on_drift(
            DriftEvent(
                state.cls.class_id,
                state.cls.label,
                direction,
                round(before_len, 3),
                round(est.ewma_length or 1.0, 3),
                tuple(round(p, 3) for p in before),
                tuple(round(p, 3) for p in est.profile().p),
                state.observed,
            )
        )

    # ---- reports and sharing ---------------------------------------------------------
    def acceptance_of(self, class_id: str) -> tuple[float, ...] | None:
        """A live class's p_1..p_K as the policy reads them (None: not a live class);
        read-only, for the step-depth rule (`engine.step_rule`)."""
        state = self._states.get(class_id)
        return None if state is None else state.estimator.profile().p

    def class_depth(self, class_id: str, bucket: int) -> int | None:
        """The depth a live class has chosen at a batch bucket, before any batch rule
        fits one of its requests to the batch in flight or a probe replaces it (None:
        no choice there yet); read-only, for reports and the twin's settling figures."""
        state = self._states.get(class_id)
        held = None if state is None else state.buckets.get(bucket)
        return None if held is None else held.k

    def snapshot(self) -> list[ClassReport]:
        """One row per live class (and `other` once it has traffic) for `/admin/classes`."""
        return [self._report(state) for state in self._states.values()]

    def _report(self, state: ClassState) -> ClassReport:
        est = state.estimator
        mean, low, high = est.window_mean()
        drift = "stable"
        if state.drift_direction:
            drift = f"drift {'up' if state.drift_direction > 0 else 'down'}"
        return ClassReport(
            class_id=state.cls.class_id,
            label=state.cls.label,
            samples=round(est.total.requests),
            acceptance_length=round(mean, 3),
            acceptance_length_ci=(round(low, 3), round(high, 3)),
            acceptance_length_ewma=None if est.ewma_length is None else round(est.ewma_length, 3),
            depth_profile=tuple(est.profile().rounded()),
            depth_trials=tuple(round(t) for t in est.total.trials_at),
            k=state.current_k(),
            k_by_batch={b: bs.k for b, bs in sorted(state.buckets.items())},
            reason=state.reason,
            drift_state=drift,
            drifts=state.drift.drifts,
            drift_statistic=round(state.drift.statistic, 3),
            explored=state.explored,
        )

    def export_deltas(self) -> ControlDeltas:
        """Sums added since the last export, per class, plus `_cost`; resets them."""
        counters: dict[str, dict[str, float]] = {}
        meta: dict[str, dict[str, str]] = {}
        for cid, state in self._states.items():
            if state.pending.requests <= 0:
                continue
            counters[cid] = state.pending.to_counters()
            meta[cid] = {"label": state.cls.label, "k": str(state.current_k())}
            state.pending = ClassStats(self._cap)
        cost = self._cost.export_counters()
        if cost:
            counters[COST_ID] = cost
        outcomes, self._outcomes = self._outcomes, 0
        return ControlDeltas(counters, meta, outcomes)

    def merge(
        self,
        remote: Mapping[str, Mapping[str, float]],
        meta: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        """Fold in other replicas' cumulative totals (only what is new since the last call)."""
        meta = meta or {}
        for cid, counters in remote.items():
            if cid == COST_ID:
                self._merge_cost(counters)
                continue
            totals = ClassStats.from_counters(counters, self._cap)
            seen = self._remote_seen.get(cid)
            increment = totals if seen is None else totals.minus(seen)
            self._remote_seen[cid] = totals
            state = self._states.get(cid)
            if state is not None:
                state.estimator.merge(increment, self._s.merge_cap_steps)
                state.version += 1
            elif len(self._unclaimed) < 4 * self._s.max_classes or cid in self._unclaimed:
                k_text = meta.get(cid, {}).get("k", "")
                remote_k = int(k_text) if k_text.isdigit() else None
                previous = self._unclaimed.get(cid, (ClassStats(self._cap), None))[0]
                previous.add(increment)
                self._unclaimed[cid] = (previous, remote_k)

    def _merge_cost(self, counters: Mapping[str, float]) -> None:
        increments = {
            name: value - self._cost_seen.get(name, 0.0)
            for name, value in counters.items()
            if value > self._cost_seen.get(name, 0.0)
        }
        self._cost_seen.update(counters)
        if increments:
            self._cost.merge_counters(increments)
