"""The depth profile of a class and the expected tokens per verify step at depth k.

p_d = P(draft position d accepted | positions 1..d-1 accepted). With a chain of
k drafts, a verify step yields the accepted prefix plus one token from the
target model (the bonus or the correction), so

    E[tokens | k] = 1 + sum_{d=1..k} prod_{j<=d} p_j.

Each p_d is the posterior mean of a Beta prior with `strength` pseudo-trials:
p_d = (accepted_d + strength * prior_d) / (trials_d + strength), where the prior
of position 1 is the class's seed (a similar class, or `prior_accept`) and the
prior of a deeper position is the estimate one position up times `depth_decay`.
Depths the class never ran therefore extrapolate smoothly instead of being 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DepthProfile:
    """Conditional acceptance per position (p_1..p_K) and the evidence behind each."""

    p: tuple[float, ...]
    trials: tuple[float, ...]

    @classmethod
    def estimate(
        cls,
        accepted: Sequence[float],
        trials: Sequence[float],
        prior: Sequence[float],
        strength: float,
        depth_decay: float,
    ) -> DepthProfile:
        """Posterior means; `prior[d]` seeds position d where given, else decay from d-1."""
        out: list[float] = []
        previous = prior[0] if prior else 0.5
        for d in range(len(trials)):
            seed = prior[d] if d < len(prior) else previous * depth_decay
            p = (accepted[d] + strength * seed) / (trials[d] + strength)
            p = min(max(p, 0.0), 1.0)
            out.append(p)
            previous = p
        return cls(tuple(out), tuple(trials))

    @property
    def depth(self) -> int:
        return len(self.p)

    def expected_tokens(self) -> list[float]:
        """E[tokens | k] for k = 0..K (index k)."""
        values = [1.0]
        chain = 1.0
        for p in self.p:
            chain *= p
            values.append(values[-1] + chain)
        return values

    def gain_spread(self, lo: int, hi: int, strength: float) -> float:
        """Standard error of E[tokens | hi] - E[tokens | lo] (lo < hi) from the evidence:

            sum_{d=lo+1..hi} chain_d * sqrt(sum_{j<=d} (1 - p_j) / (p_j (trials_j + strength)))

        with chain_d = prod_{j<=d} p_j: the delta method on each position's Beta
        posterior (var log p = (1 - p) / (p n)), the chains summed as if perfectly
        correlated (an upper bound). A position with little evidence spreads widely.
        """
        total, chain, var = 0.0, 1.0, 0.0
        for d in range(min(hi, len(self.p))):
            p = max(self.p[d], 1e-3)
            chain *= p
            var += (1.0 - p) / (p * (self.trials[d] + strength))
            if d >= lo:
                total += chain * var**0.5
        return total

    def rounded(self, digits: int = 3) -> list[float]:
        return [round(p, digits) for p in self.p]
