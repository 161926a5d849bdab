"""A clairvoyant yardstick: each step at the depth that, knowing the draws, gains most.

At every step this engine knows each decoding request's actual acceptance draws
at its current position (`TwinRequest.runs`: run r_i of accepted drafts) and its
tokens left (rem_i), and runs the batch at the depth D that maximises the step's
tokens per second,

    D = argmax_D (b + sum_i min(r_i, D, rem_i - 1)) / step(b, D),

every request drafting D (its cost is the batch's deepest anyway). Greedy per
step on the speculative engine (drafter prefill for every request, k = 0 at the
profile's k = 0 cost), so it is a ceiling for any policy that picks one depth
per step with the same costs, not a strict bound on every schedule; it reads the
dice, which no real controller can.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.twin.costs import StepCosts
from bench.twin.engine import LiveRequest, Plan
from bench.twin.modes.static import EngineWide
from bench.twin.requests import TwinRequest


class Clairvoyant(EngineWide):
    """Per step, the depth maximising this step's tokens per second from the true draws."""

    def __init__(self, costs: StepCosts) -> None:
        self._costs = costs
        self._last = 0

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        return Plan(self._last)

    def step_depth(self, batch: int, running: Sequence[LiveRequest] = ()) -> int:
        k_max = self._costs.max_k
        useful = [0] * (k_max + 1)
        for live in running:
            r = live.runs[live.pos]
            left = live.out - live.pos - 1
            useful[min(r, left, k_max)] += 1
        row = self._costs.spec[batch]
        tokens, deeper = float(batch), batch - useful[0]
        best, best_rate = 0, tokens / row[0]
        for depth in range(1, k_max + 1):
            tokens += deeper
            deeper -= useful[depth]
            rate = tokens / row[depth]
            if rate > best_rate * (1 + 1e-12):
                best, best_rate = depth, rate
        self._last = best
        return best
