"""Where a request's k meets the batch in flight: hold, floor, lower, ride.

A step costs what the batch's deepest request asks (`batch_load`): the drafter
drafts that deep for every request in the step, and its first pass takes every
newcomer's prompt. So a class's k is paid by all its batch-mates, and a request
at a smaller k than the batch pays for the batch's depth anyway. Given the k its
class chose at this load (`ClassState.adaptive_k`), a request here is

1. held to the depth D in [k_min, k] at which the batch yields the most tokens
   per unit of step cost: sum over the requests in flight of E[tokens | min(k_i,
   D)] (`LoadSnapshot.mates`) plus its own, over c(D); a D below the batch's
   running depth must also repay what this request gives up until the batch
   comes down (`held`);
2. floored where a guarded class is in flight (`batch_floor`): no deeper than
   leaves each guarded request its floor share of its speed at k = 0;
3. with `batch_floor` set for its own class, it lowers the requests already in
   flight to what its floor affords (`lower_for_floor`); else, with `batch_lower`,
   it lowers them where the whole batch yields more tokens per step cost at a
   lower depth (`lower_for_batch`);
4. else, with `batch_ride`, it rides at the depth a request in flight chose
   (`LoadSnapshot.anchored`) where its class chose less.

Costs c(D) are the cost model's relative step costs at the load's bucket. This
runs for most requests under load, inside the decision path's 20 us budget
(`bench/decision_latency.py`): plain loops over at most K + 1 depths, decisions
cached by `ClassState`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from gateway.control.class_state import ClassState
from gateway.control.cost_model import CostModel
from gateway.control.decision import ControlOverrides, LoadSnapshot, SpeculationDecision


class BatchDepth:
    """The batch-level rules of `Controller.decide`, over one cost model."""

    __slots__ = ("_cost", "_hold")

    def __init__(self, cost: CostModel, hysteresis: float) -> None:
        self._cost = cost
        #: A cut of the requests in flight must beat the batch's depth by the hysteresis.
        self._hold = 1.0 + hysteresis

    def fit(
        self,
        state: ClassState,
        decision: SpeculationDecision,
        k: int,
        k_bounds: tuple[int, int],
        bucket: int,
        load: LoadSnapshot,
        o: ControlOverrides,
    ) -> SpeculationDecision:
        """`decision`, its class's k at this bucket, fitted to the batch in flight."""
        k_min, k_max = k_bounds
        depth = steady = k
        mates = load.mates
        if mates is not None and k > k_min and load.running > 0:
            depth, steady = self.held(k, k_min, mates, decision.gains, bucket, load.deepest)
        if load.guarded:
            floored = self.floor(load, bucket, depth, k_min)
            if floored < depth:
                decision, depth = state.held_at(decision, floored, floor=True), floored
        if depth != k and decision.k != depth:
            decision = state.held_at(decision, depth)
        if o.batch_floor > 0.0:
            if load.deepest > depth:
                return self.lower_for_floor(decision, o.batch_floor, bucket, load.deepest)
            return decision
        if (
            o.batch_lower
            and mates is not None
            and load.deepest > min(depth, steady)
            and load.running > 0
            and not load.fixed
        ):
            # The batch drafts at the depth its deepest request chose, perhaps when it
            # was alone (a class chooses at the load it meets: the first of a burst at
            # batch 1, where drafts are cheap), and everyone after it pays that depth
            # for its life. Not while a request whose k an operator set (a pin, static
            # mode) is among them.
            ridable = k_max if o.batch_ride and depth == k else depth
            lowered = self.lower_for_batch(
                state, decision, mates, bucket, depth, load, ridable, min(depth, steady)
            )
            if lowered is not None:
                return lowered
        if o.batch_ride and depth == k and load.anchored > k and load.running > 0:
            # Below the batch's depth it pays for the depth's drafts and gains none of
            # their tokens. Riders anchor at their class's k, so a batch of riders comes
            # down once the request that wanted D has left (`BatchLoad.anchored`). Not
            # where the batch's tokens held it below its class's k: there the batch is
            # to come down, and a rider at D would keep it at D for its own life.
            ride = min(load.anchored, k_max)
            if load.guarded:
                ride = self.floor(load, bucket, ride, k_min)
            if ride > depth:
                return state.rides_at(decision, ride)
        return decision

    def held(
        self,
        k: int,
        k_min: int,
        mates: Sequence[float],
        gains: Sequence[float],
        bucket: int,
        deepest: int,
    ) -> tuple[int, int]:
        """The depth D in [k_min, k] with the most tokens per unit of step cost, and
        where the batch would settle were it to come down now.

        At D the requests in flight yield `mates[D]` tokens a step and this one
        `gains[D]` (E[tokens | min(its k, D)]), in a step of relative cost c(D). The
        batch runs at its deepest request's depth (`deepest`, clamped to [k_min, k]:
        the incumbent) until that request finishes, so a D below the incumbent lowers
        no step cost yet while this request yields `gains[D]` instead of the
        incumbent's: such a D must beat the incumbent by that shortfall's share of
        the batch's tokens, (gains[I] - gains[D]) / (mates[I] + gains[I]). A D above
        it raises every request's step at once and stands on its value alone. Those
        in flight keep their k; the batch moves as they finish.

        The settling depth is the same argmax without the shortfall, ties to the
        shallower depth: the least a cut of the requests in flight (`lower_for_batch`)
        goes to. Both in one pass: this runs on the decision path.
        """
        costs = self._cost.relative_costs_in(bucket)
        if len(gains) <= k or len(costs) <= k:
            return k, k
        incumbent = min(max(deepest, k_min), k)
        now = mates[incumbent] + gains[incumbent]
        best, top = incumbent, now / costs[incumbent]
        settled, peak = k_min, -1.0
        for d in range(k_min, k + 1):
            value = (mates[d] + gains[d]) / costs[d]
            if value > peak:
                settled, peak = d, value
            if d < incumbent:
                value /= 1.0 + (gains[incumbent] - gains[d]) / now
            if value > top:
                best, top = d, value
        return best, settled

    def floor(self, load: LoadSnapshot, bucket: int, k: int, k_min: int) -> int:
        """The deepest D <= k at which every guarded request in flight keeps its floor.

        A request in flight yields `gains[D]` tokens a step at batch depth D (at most
        its own k's: one held at k = 0 yields one token at every D), each step costing
        c(D) = cost(D) / cost(0) of a step at k = 0: that share of its speed at k = 0,
        which must stay at or above its class's `batch_floor`.
        Weighed whatever depth the batch runs at now: excusing depths the batch
        already had would let each deep newcomer keep the batch deep for the next
        one, below the guarded requests' floor. Requests in flight keep their k, so
        the batch comes down as they finish; `k_min` (the newcomer's own flags) still
        binds.
        """
        guarded = load.guarded
        if not guarded or k <= k_min:
            return k
        costs = self._cost.relative_costs_in(bucket)
        d = k
        while d > k_min:
            c = costs[d] if d < len(costs) else costs[-1]
            if all((g[min(d, len(g) - 1)] if g else 1.0) >= f * c for g, f in guarded):
                break
            d -= 1
        return d

    def lower_for_batch(
        self,
        state: ClassState,
        decision: SpeculationDecision,
        mates: Sequence[float],
        bucket: int,
        depth: int,
        load: LoadSnapshot,
        ridable: int,
        lowest: int,
    ) -> SpeculationDecision | None:
        """`decision` with a batch cap where the batch gains from a lower depth, else None.

        At batch depth D the requests in flight yield `mates[D]` tokens a step (each
        at its k capped at D) and this one E[tokens | min(D, ridable)], in a step of
        relative cost c(D). D runs from `lowest` (where the batch's tokens would hold
        this request were the batch to come down: at most its depth) to the batch's
        deepest;
        the deepest (no cap) wins ties and must be beaten by the hysteresis. A cap
        above this request's depth lets it ride there, up to `ridable` (its depth
        where it may not ride: `batch_ride` off, or the batch's tokens held it), as it
        would at the batch's depth. Requests in flight never go back up (their
        drafter KV stops at the cap), so the cap is paid for in their later steps
        too; the hysteresis is what keeps a small edge from cutting them.
        """
        costs = self._cost.relative_costs_in(bucket)
        deepest = min(load.deepest, len(costs) - 1, len(mates) - 1)
        if deepest <= lowest:
            return None
        # At batch depth D it runs at min(D, ridable) and yields E[tokens | that depth].
        expected = state.estimator.profile().expected_tokens()
        top_own = len(expected) - 1

        def own(d: int) -> float:
            return expected[min(d, ridable, top_own)]

        keep = (mates[deepest] + own(deepest)) / costs[deepest] * self._hold
        best, top = deepest, keep
        for d in range(lowest, deepest):
            value = (mates[d] + own(d)) / costs[d]
            if value > top:
                best, top = d, value
        if best >= deepest:
            return None
        ride = min(best, ridable)
        if ride < depth:
            base = state.held_at(decision, ride)
        elif ride > depth:
            base = state.rides_at(decision, ride)
        else:
            base = decision
        return dataclasses.replace(
            base,
            batch_cap=best,
            reason=f"{base.reason}; lowers the batch from k={load.deepest} to k={best}: "
            f"{top / keep * self._hold:.2f}x the batch's tokens per step cost",
        )

    def lower_for_floor(
        self, decision: SpeculationDecision, floor: float, bucket: int, deepest: int
    ) -> SpeculationDecision:
        """`decision` with the batch cap its class's floor needs among deeper requests.

        The floor guards a request against batch-mates that join deeper (`floor`);
        this guards it against those already there, which otherwise keep their depth
        until they finish, longer than a short request lives. The cap is the deepest
        D (between this request's k and the batch's deepest) at which its expected
        tokens per step at its own k, over a step's relative cost c(D) at batch depth
        D, stay at or above the floor; the engine lowers every request in flight to D
        as this one enters (`engine.vllm.scheduler`).
        """
        costs = self._cost.relative_costs_in(bucket)
        gains = decision.gains
        own = gains[min(decision.k, len(gains) - 1)] if gains else 1.0
        d = deepest
        while d > decision.k and own < floor * (costs[d] if d < len(costs) else costs[-1]):
            d -= 1
        if d >= deepest:
            return decision
        return dataclasses.replace(
            decision,
            batch_cap=d,
            reason=f"{decision.reason}; lowers the batch from k={deepest} to k={d} for its floor",
        )
