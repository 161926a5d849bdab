"""`goodput`: the k that maximises a class's tokens per unit of engine time.

A request of L output tokens takes its first token, then L - 1 more at
E[tokens | k] per step:

    goodput(k, b) = L / (f(k, b) + (L - 1) * c(k, b) / E[tokens | k]),
    E[tokens | k] = 1 + sum_{d=1..k} prod_{j<=d} p_j,

with p from the class's depth profile, c(k, b) = cost(k, b) / cost(0, b) from the
online cost model at batch bucket b, f(k, b) the time to the first token in steps
at k = 0 (start-up calibration) and L the class's mean reply length. For long
replies this is E / c; for short ones the first token's price of speculation
(the drafter's prefill and first drafts) can outweigh what the steps save.
A class at k = 0 also pays, at any k > 0, the prompt tokens its k = 0 runs find
cached and a k > 0 request prefills again (`PolicyInput.switch_steps`): k = 0
requests cache apart, so leaving k = 0 costs each request whose prompt (its
conversation so far, a repeated prompt) was cached there one cold prefill. Not
priced the other way: k = 0 is the floor of the no-loss promise, and under load
a class kept at k > 0 makes every batch-mate draft.
Parameters:

- `min_samples`: below it the class keeps its current (cold-start) k, or steps
  down where its estimate so far pays more at a smaller k (never up);
- `hysteresis` h: a new k must beat the current one by a factor (1 + m), with the
  margin m relative to the evidence: m = min(h, max(HYSTERESIS_FLOOR, 2 se / E[lo]))
  where se is the standard error of E[tokens | hi] - E[tokens | lo] between the two
  depths (`DepthProfile.gain_spread`): a class with thousands of trials at the
  positions between them moves on a 1 % gain, one with few waits for h;
- `min_dwell`: requests of the class between two changes at a bucket;
- `prior_output_tokens`: L of a class that has not finished a request yet;
- `queue_weight` q (0: off, the default): the queue's cost (below).

The queue's cost. Under open-loop arrivals near capacity a step's extra cost compounds
in the queue: while w requests wait for admission, every second a step at k spends
beyond the step at k = 0 is a second each of them waits longer, shared by the b
requests whose step it is. So where w > 0, at decision time (`under_queue`, the
cached choice k the upper bound):

    charged(d) = 1 / (1 / goodput(d) + q (w / b) (c(d, b) - 1) / E[tokens | d] * (L - 1) / L)

(the extra step-seconds of the request's (L - 1) / E decode steps, per token, in steps
at k = 0), and the request runs at the d <= k that maximises it where that beats k by
more than HYSTERESIS_FLOOR. Without waiting requests, or at q = 0, nothing changes.

A current k outside the flag bounds is replaced at once, whatever the gain.

Its inputs beyond the shared ones (`inputs`): f and c from the cost model, L from
the class's estimator, and the switch price from its own memory of each class's
prompts (`observe`): their mean length and the shares its k = 0 and k > 0 runs
found in the prefix cache (`PromptCache`), times the calibrated cold prefill per
token in steps at k = 0 (`CostModel.prefill_steps`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from engine.interface import RequestOutcome
from gateway.control.policies.base import Choice, PolicyInput, PolicySpec, Situation

#: The smallest gain that moves a class with ample evidence: below it, a refit's noise
#: in the step costs (`COST_TOLERANCE` is 1 %) would flap its k.
HYSTERESIS_FLOOR = 0.01


class GoodputParams(BaseModel):
    """Read from the `ControllerSettings` fields of the same names (bounds there)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_samples: int
    hysteresis: float
    min_dwell: int
    prior_output_tokens: float
    prior_strength: float = 4.0
    #: The waiting requests' delay per extra step-second of a request, against its own
    #: time (module docstring: q); 0 prices no queue.
    queue_weight: float = Field(0.0, ge=0.0, le=16.0)


@dataclass(slots=True)
class PromptCache:
    """What one class's prompts find in the prefix cache, by namespace (moving means)."""

    #: Moving mean of the class's prompt tokens (0 until its first request).
    prompt_tokens: float = 0.0
    #: Moving share of its k = 0 runs' prompt tokens found in the prefix cache. It
    #: starts at 1: a class's first run is cold whatever repeats, and a probe right
    #: after it would pay the whole prompt again.
    zero_cached_share: float = 1.0
    #: The same share of its k > 0 runs (None until it has run at k > 0): what of the
    #: class's prompts the k > 0 namespace already holds, which a move there keeps.
    spec_cached_share: float | None = None

    def note(self, outcome: RequestOutcome) -> None:
        tokens = outcome.prompt_tokens
        if tokens <= 0:
            return
        mean = self.prompt_tokens
        self.prompt_tokens = float(tokens) if mean <= 0 else mean + 0.2 * (tokens - mean)
        share = outcome.cached_prompt_tokens / tokens
        if outcome.speculation.k == 0:
            self.zero_cached_share += 0.2 * (share - self.zero_cached_share)
        elif self.spec_cached_share is None:
            self.spec_cached_share = share
        else:
            self.spec_cached_share += 0.2 * (share - self.spec_cached_share)

    def cold_tokens(self) -> float:
        """Prompt tokens a request at k > 0 is expected to prefill beyond a k = 0 run's.

        k = 0 requests cache under their own salt (`engine.vllm.scheduler`), so what the
        class's k = 0 runs find cached, a request at k > 0 prefills again, less what
        its k > 0 runs found cached there (a class that ran deep before, at this
        load or another, still has its prompts in that namespace).
        """
        spec = self.spec_cached_share or 0.0
        return self.prompt_tokens * max(0.0, self.zero_cached_share - spec)


class GoodputPolicy:
    name = "goodput"

    def __init__(
        self,
        min_samples: int,
        hysteresis: float,
        min_dwell: int,
        prior_output_tokens: float = 128.0,
        prior_strength: float = 4.0,
        queue_weight: float = 0.0,
    ) -> None:
        self.prior_strength = prior_strength
        self.queue_weight = queue_weight
        self.min_samples = min_samples
        self.hysteresis = hysteresis
        self.min_dwell = min_dwell
        self.prior_output_tokens = prior_output_tokens
        self._prompts: dict[str, PromptCache] = {}

    @classmethod
    def from_params(cls, params: GoodputParams) -> GoodputPolicy:
        return cls(
            params.min_samples,
            params.hysteresis,
            params.min_dwell,
            params.prior_output_tokens,
            params.prior_strength,
            params.queue_weight,
        )

    def inputs(self, at: Situation) -> PolicyInput:
        cost, bucket, est = at.cost, at.bucket, at.estimator
        prompts = self._prompts.get(at.class_id)
        cold = prompts.cold_tokens() if prompts is not None else 0.0
        switch = cold * cost.prefill_steps(bucket)
        return PolicyInput(
            profile=est.profile(),
            samples=est.samples_since_reset,
            current_k=at.current_k,
            k_min=at.k_min,
            k_max=at.k_max,
            since_change=at.since_change,
            relative_cost=cost.relative_costs(bucket),
            first_token=cost.first_token(bucket),
            output_tokens=est.mean_output_tokens(self.prior_output_tokens),
            switch_steps=switch if at.current_k == 0 else 0.0,
        )

    def observe(self, class_id: str, outcome: RequestOutcome) -> None:
        prompts = self._prompts.get(class_id)
        if prompts is None:
            prompts = self._prompts[class_id] = PromptCache()
        prompts.note(outcome)

    def forget(self, class_id: str) -> None:
        self._prompts.pop(class_id, None)

    def under_queue(self, at: Situation, k: int, queued: int, batch: int) -> int:
        """The depth <= k that maximises the queue-charged goodput (module docstring)."""
        if self.queue_weight <= 0.0 or queued <= 0 or k <= at.k_min:
            return k
        inp = self.inputs(at)
        charged = queue_charged(inp, k, self.queue_weight * queued / max(batch, 1))
        best = max(range(min(at.k_min, k), k + 1), key=lambda d: (charged[d], -d))
        if charged[best] > charged[k] * (1.0 + HYSTERESIS_FLOOR):
            return best
        return k

    def score(self, inp: PolicyInput) -> tuple[float, ...]:
        return goodput_of(inp, min(inp.k_max, inp.profile.depth, len(inp.relative_cost) - 1))

    def choose(self, inp: PolicyInput) -> Choice:
        k_max = min(inp.k_max, inp.profile.depth, len(inp.relative_cost) - 1)
        k_min = min(inp.k_min, k_max)
        current = inp.current_k
        goodput = goodput_of(inp, k_max)
        if inp.samples < self.min_samples:
            return self._cold(inp, min(max(current, k_min), k_max), k_min, goodput)
        best = k_min
        for k in range(k_min + 1, k_max + 1):
            if goodput[k] > goodput[best]:
                best = k
        if not k_min <= current <= k_max:
            return Choice(best, f"bounds [{k_min},{k_max}]: best k={best}", goodput)
        if best == current:
            return Choice(current, "best", goodput)
        gain = goodput[best] / goodput[current] - 1.0
        if gain <= self.margin(inp, best, current) or inp.since_change < self.min_dwell:
            return Choice(current, "hold", goodput, best if best > current else None)
        return Choice(best, f"goodput +{gain:.0%} at k={best} over k={current}", goodput)

    def margin(self, inp: PolicyInput, a: int, b: int) -> float:
        """The gain a move between depths a and b must exceed (module docstring: m)."""
        lo, hi = (a, b) if a < b else (b, a)
        profile = inp.profile
        spread = profile.gain_spread(lo, hi, self.prior_strength)
        expected = profile.expected_tokens()[min(lo, profile.depth)]
        return min(self.hysteresis, max(HYSTERESIS_FLOOR, 2.0 * spread / expected))

    def _cold(self, inp: PolicyInput, k: int, k_min: int, goodput: tuple[float, ...]) -> Choice:
        """Too few samples to trust the estimate's deep positions: hold k, or step down.

        A step down needs only that the current estimate (mostly its prior) pays
        less at k than at a smaller depth by more than the hysteresis, at this
        load's measured costs: where a drafted token costs most of a step (a busy
        CPU engine), even a good class's prior cannot pay for k = 3, and holding it
        until `min_samples` requests have run made every request of a rare class,
        and its batch-mates, pay for it. Never up: that waits for evidence.
        """
        reason = f"cold start ({inp.samples:.0f}/{self.min_samples} samples)"
        best = max(range(k_min, k + 1), key=lambda d: (goodput[d], -d))
        gain = goodput[best] / goodput[k] - 1.0
        if best < k and gain > self.hysteresis and inp.since_change >= self.min_dwell:
            return Choice(best, f"{reason}: goodput +{gain:.0%} at k={best}", goodput)
        return Choice(k, reason, goodput)


def goodput_of(inp: PolicyInput, k_max: int) -> tuple[float, ...]:
    """Expected goodput of k = 0..k_max (the module docstring's formula)."""
    expected = inp.profile.expected_tokens()
    cost = inp.relative_cost
    first, length = inp.first_token, inp.output_tokens
    if len(first) <= k_max or length <= 1.0:
        return tuple([expected[k] / cost[k] for k in range(k_max + 1)])
    # Normalised so that long replies give E / c, as without the first-token term.
    rest = length - 1.0
    switch = inp.switch_steps if inp.current_k == 0 else 0.0
    return tuple(
        [
            length / (first[k] + (switch if k else 0.0) + rest * cost[k] / expected[k])
            for k in range(k_max + 1)
        ]
    )


def queue_charged(inp: PolicyInput, k_max: int, per_request: float) -> tuple[float, ...]:
    """`goodput_of` with each waiting request's delay charged (module docstring), at
    `per_request` = q w / b."""
    goodput = goodput_of(inp, k_max)
    expected, cost = inp.profile.expected_tokens(), inp.relative_cost
    length = inp.output_tokens
    rest = (length - 1.0) / length if len(inp.first_token) > k_max and length > 1.0 else 1.0
    return tuple(
        1.0 / (1.0 / g + per_request * (cost[d] - cost[0]) / expected[d] * rest) if g > 0 else 0.0
        for d, g in enumerate(goodput)
    )


SPEC = PolicySpec(GoodputParams, GoodputPolicy.from_params)
