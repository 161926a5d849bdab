"""vLLM's batch-size schedule: one speculation depth per step, chosen by the batch size.

vLLM's `speculative_config.num_speculative_tokens_per_batch_size = [[lo, hi, k], ...]`
runs every step whose batch holds lo..hi requests at depth k (`num_spec_tokens_to_schedule`
in `SchedulerOutput`; DESIGN.md, "Dynamic SD"). The table is what its dynamic-SD
profiler would write: for each batch size b,

    k(b) = argmax_k (1 + sum_{d <= k} m_d) / step_ms(b, k)

the expected tokens per step over the step's cost, with m_d the marginal acceptance
of draft position d: the profile's `acceptance_rate_per_pos` where it has one (the
rates it was measured with; positions beyond it count as never accepted), else
the workload's mix-average over its phases (the unshifted class profiles: the
schedule is fixed offline, before any drift).
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.twin.costs import StepCosts
from bench.twin.engine import LiveRequest
from bench.twin.modes.static import EngineWide
from bench.twin.schema import Profile, Workload


def mix_marginals(workload: Workload, depth: int) -> list[float]:
    """Mix-average marginal acceptance per position 1..depth (prefix products of the
    conditional rates), weighted by each class's share of the whole run."""
    weights: dict[str, float] = {}
    for phase in workload.phases:
        for name, share in phase.mix.items():
            weights[name] = weights.get(name, 0.0) + share * phase.requests
    total = sum(weights.values())
    out = [0.0] * depth
    for name in sorted(weights):
        acceptance = workload.classes[name].acceptance
        reach = 1.0
        for d in range(depth):
            reach *= acceptance[min(d, len(acceptance) - 1)]
            out[d] += reach * weights[name] / total
    return out


def marginals(profile: Profile, workload: Workload) -> list[float]:
    depth = profile.max_k
    if profile.acceptance_rate_per_pos is not None:
        rates = list(profile.acceptance_rate_per_pos[:depth])
        return rates + [0.0] * (depth - len(rates))
    return mix_marginals(workload, depth)


def depth_table(costs: StepCosts, rates: Sequence[float]) -> tuple[int, ...]:
    """k(b) for b = 0..len(costs.spec) - 1 (index 0 unused)."""
    table = []
    for row in costs.spec:
        best, best_rate, tokens = 0, 0.0, 1.0
        for k in range(costs.max_k + 1):
            if k:
                tokens += rates[k - 1]
            rate = tokens / row[k]
            if rate > best_rate * (1 + 1e-12):
                best, best_rate = k, rate
        table.append(best)
    return tuple(table)


def table_of(schedule: Sequence[Sequence[int]], batches: int, max_k: int) -> tuple[int, ...]:
    """A `[[lo, hi, k], ...]` schedule as k(b) for b = 0..batches (k 0 outside its ranges)."""
    table = [0] * (batches + 1)
    for lo, hi, k in schedule:
        for b in range(max(lo, 0), min(hi, batches) + 1):
            table[b] = min(k, max_k)
    return tuple(table)


def ranges(table: Sequence[int]) -> list[list[int]]:
    """The table as vLLM's [[lo, hi, k], ...] from batch 1 on."""
    out: list[list[int]] = []
    for b in range(1, len(table)):
        if out and out[-1][2] == table[b]:
            out[-1][1] = b
        else:
            out.append([b, b, table[b]])
    return out


class BatchSchedule(EngineWide):
    """Every step at the depth the table gives its batch size."""

    def __init__(self, table: Sequence[int]) -> None:
        self.table = tuple(table)

    def step_depth(self, batch: int, running: Sequence[LiveRequest] = ()) -> int:
        return self.table[min(batch, len(self.table) - 1)]
