"""The seeded, offline mixed workload: phases whose family mix shifts, and arrival processes.

A run is a sequence of phases; each phase draws its requests' families from its
own mix, so the class mix changes at each phase boundary (drift mid-run), the
way production traffic shifts from chat to tool use to code over a day. The
same seed gives the same requests in the same order for every mode, so modes
are compared on identical traffic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bench.families import Prompt, PromptPool


@dataclass(frozen=True, slots=True)
class Phase:
    """A stretch of traffic with one family mix (weights need not sum to 1)."""

    name: str
    requests: int
    mix: dict[str, float]


@dataclass(frozen=True, slots=True)
class WorkItem:
    index: int
    phase: int
    phase_name: str
    family: str
    prompt: Prompt
    max_tokens: int


@dataclass(frozen=True, slots=True)
class ClosedLoop:
    """`concurrency` clients, each sending its next request when the previous one ends."""

    concurrency: int

    @property
    def label(self) -> str:
        return f"c{self.concurrency}"


@dataclass(frozen=True, slots=True)
class Poisson:
    """Open loop: requests arrive at exponential gaps with mean 1/rate, whatever the latency."""

    rate_per_s: float
    seed: int = 0

    @property
    def label(self) -> str:
        return f"poisson{self.rate_per_s:g}"

    def offsets(self, n: int) -> list[float]:
        rng = random.Random(self.seed)
        t, out = 0.0, []
        for _ in range(n):
            out.append(t)
            t += rng.expovariate(self.rate_per_s)
        return out


Arrival = ClosedLoop | Poisson


def default_phases(per_phase: int) -> list[Phase]:
    """Three phases: chat-heavy, then tools and foreign templates, then code and long context.

    Main-template chat comes greedy (`chat_main`) and sampled (`chat_sampled`, T = 0.7).
    """
    return [
        Phase(
            "chat",
            per_phase,
            {
                "chat_main": 0.35,
                "chat_sampled": 0.2,
                "code": 0.25,
                "tool_call": 0.1,
                "chat_unfamiliar_system": 0.1,
            },
        ),
        Phase(
            "tools+templates",
            per_phase,
            {
                "chat_main": 0.15,
                "tool_call": 0.35,
                "chat_alt_template": 0.3,
                "chat_unfamiliar_system": 0.2,
            },
        ),
        Phase(
            "code+long",
            per_phase,
            {"code": 0.45, "long_context": 0.2, "chat_main": 0.2, "chat_sampled": 0.15},
        ),
    ]


def family_counts(mix: dict[str, float], requests: int) -> dict[str, int]:
    """Requests of each family in a phase: the mix's shares of `requests`, rounded to whole
    requests by largest remainder (ties to the family named first).

    Counts, not independent draws: a draw per request let chance decide how much
    evidence a rare family got (seed 1234 gave long context one request a run where
    its 0.2 share of 12 asks for 2.4), and every per-class figure of the benchmark
    rests on these counts.
    """
    total = sum(mix.values())
    if total <= 0:
        raise ValueError("a phase's mix needs a positive weight")
    exact = {f: requests * w / total for f, w in mix.items()}
    counts = {f: int(x) for f, x in exact.items()}
    order = sorted(mix, key=lambda f: (-(exact[f] - counts[f]), list(mix).index(f)))
    for f in order[: requests - sum(counts.values())]:
        counts[f] += 1
    return counts


def build_workload(
    phases: list[Phase], pool: PromptPool, seed: int, max_tokens: int
) -> list[WorkItem]:
    """Requests in order: each phase's families in the counts its mix asks for
    (`family_counts`), shuffled, each with a prompt drawn from the pool."""
    rng = random.Random(seed)
    items: list[WorkItem] = []
    for p, phase in enumerate(phases):
        mix = {f: w for f, w in phase.mix.items() if pool.get(f)}
        if not mix:
            raise ValueError(f"phase {phase.name!r}: none of its families has prompts")
        families = [f for f, n in family_counts(mix, phase.requests).items() for _ in range(n)]
        rng.shuffle(families)
        for family in families:
            prompt = rng.choice(pool[family])
            items.append(WorkItem(len(items), p, phase.name, family, prompt, max_tokens))
    return items


def phase_boundaries(items: list[WorkItem]) -> list[int]:
    """Index of the first request of every phase after the first."""
    return [i for i in range(1, len(items)) if items[i].phase != items[i - 1].phase]
