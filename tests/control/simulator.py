"""A synthetic outcome source: known per-position acceptance and a known step cost.

Each verify step drafts k tokens; position d is accepted with probability p_d
given that d-1 was (the chain stops at the first rejection), and the step emits
the accepted prefix plus one token. The step time is
`base_s * (1 + draft_cost * k * (1 + batch / saturation))`, so the goodput-optimal
k is known in closed form (`optimal_k`) and the tests can check the controller
against it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from engine.interface import RequestOutcome, SpeculationOutcome


@dataclass(frozen=True, slots=True)
class StepCost:
    base_s: float = 0.02
    draft_cost: float = 0.05
    saturation: float = 8.0

    def seconds(self, k: int, batch: int) -> float:
        return self.base_s * (1.0 + self.draft_cost * k * (1.0 + batch / self.saturation))


def expected_tokens(p: Sequence[float], k: int) -> float:
    total, chain = 1.0, 1.0
    for d in range(k):
        chain *= p[d]
        total += chain
    return total


def goodput(p: Sequence[float], k: int, batch: int, cost: StepCost) -> float:
    return expected_tokens(p, k) / (cost.seconds(k, batch) / cost.seconds(0, batch))


def optimal_k(p: Sequence[float], max_k: int, batch: int, cost: StepCost) -> int:
    return max(range(max_k + 1), key=lambda k: goodput(p, k, batch, cost))


def simulate(
    rng: random.Random,
    p: Sequence[float],
    k: int,
    batch: int = 1,
    cost: StepCost = StepCost(),
    output_tokens: int = 64,
    prompt_tokens: int = 200,
) -> RequestOutcome:
    """One finished request at depth k with true profile p, as the engine reports it."""
    accepted_at = [0] * k
    drafted_at = [0] * k
    produced = steps = accepted = 0
    while produced < output_tokens:
        steps += 1
        n = 0
        while n < k and rng.random() < p[n]:
            n += 1
        for d in range(k):
            drafted_at[d] += 1
        for d in range(n):
            accepted_at[d] += 1
        accepted += n
        produced += n + 1
    ttft = 0.05
    step_s = cost.seconds(k, batch)
    return RequestOutcome(
        request_id=f"sim-{rng.random():.12f}",
        prompt_tokens=prompt_tokens,
        output_tokens=produced,
        finish_reason="length",
        speculation=SpeculationOutcome(
            k=k,
            verify_steps=steps if k > 0 else 0,
            draft_tokens=k * steps,
            accepted_tokens=accepted,
            accepted_per_position=tuple(accepted_at),
            drafted_per_position=tuple(drafted_at),
        ),
        ttft_s=ttft,
        tpot_s=(steps - 1) * step_s / max(1, produced - 1),
        e2e_s=ttft + (steps - 1) * step_s,
        decode_steps=steps,
    )
