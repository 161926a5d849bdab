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
- `hysteresis` h: a new k must beat the current one by a factor (1 + h);
- `min_dwell`: requests of the class between two changes at a bucket.

A current k outside the flag bounds is replaced at once, whatever the gain.
"""

from __future__ import annotations

from gateway.control.policies.base import Choice, PolicyInput


class GoodputPolicy:
    name = "goodput"

    def __init__(self, min_samples: int, hysteresis: float, min_dwell: int) -> None:
        self.min_samples = min_samples
        self.hysteresis = hysteresis
        self.min_dwell = min_dwell

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
        if gain <= self.hysteresis or inp.since_change < self.min_dwell:
            return Choice(current, "hold", goodput)
        return Choice(best, f"goodput +{gain:.0%} at k={best} over k={current}", goodput)

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
