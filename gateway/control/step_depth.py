"""One depth per engine step, chosen for the whole batch: the step-depth rule.

On CUDA the engine verifies one depth d per step (every drafting request verifies
d, the others none; `engine/vllm/batch_depth.py`), and the step's time is the batch's
at that depth, c(B, d). A per-request k from each class's own argmax ignores that
the deepest vote sets everyone's cost. This rule instead picks, per step,

    d* = argmax_d  sum_r E_r(d) / c(B, d),   E_r(d) = 1 + sum_{j<=d} prod_{i<=j} p_{r,i}

(the expected tokens of a chain of d drafts, `DepthProfile.expected_tokens`), with
request r drafting at d when that gains it anything (E_r(d) > 1) and verifying
none otherwise. Requests of one class share p, so the batch comes as groups
(acceptance vector, count): O(G K) for G groups, O(B K) at worst.

Guard (`floor`): no request may lose by the step's depth, E_r(d) / c(B, d) >=
floor / c(B, 0): its tokens per unit time at d against the same step at depth 0.
A class whose acceptance makes every d > 0 a loss thus holds the whole batch at 0
(its null yardstick), and a weak class caps how deep its batch-mates go. `floor`
None turns the guard off (pure throughput). Ties go to the shallower depth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: A depth must beat the best so far by this relative margin (ties to the shallower).
TIE = 1e-12


@dataclass(frozen=True, slots=True)
class StepDepth:
    """The rule's answer: the step's depth, who drafts, and the expected tokens per cost."""

    depth: int
    #: Per group (or request), in input order: it verifies `depth` drafts (else none).
    drafts: tuple[bool, ...]
    #: Expected tokens of the step over its cost (the cost's unit: seconds or relative).
    rate: float


def expected_tokens(p: Sequence[float], max_depth: int) -> list[float]:
    """E[tokens | d] for d = 0..max_depth; positions beyond `p` take its last value."""
    out = [1.0]
    chain = 1.0
    last = p[-1] if p else 0.0
    for d in range(max_depth):
        chain *= p[d] if d < len(p) else last
        out.append(out[-1] + chain)
    return out


def choose_step_depth(
    groups: Sequence[tuple[Sequence[float], int]],
    costs: Sequence[float],
    floor: float | None = 1.0,
) -> StepDepth:
    """The step's depth for `groups` of (p_1..p_K, requests) at step costs `costs`
    (c(B, d) for d = 0..K, any unit; only ratios matter). Module docstring."""
    if not costs or costs[0] <= 0:
        raise ValueError("step costs need c(B, 0) > 0")
    max_depth = len(costs) - 1
    gains = [expected_tokens(p, max_depth) for p, _ in groups]
    live = [(g, n) for g, (_, n) in zip(gains, groups, strict=True) if n > 0]
    if not live:
        return StepDepth(0, tuple(False for _ in groups), 0.0)
    requests = sum(n for _, n in live)
    best, best_rate = 0, requests / costs[0]
    for d in range(1, max_depth + 1):
        cost = costs[d]
        if cost <= 0:
            continue
        tokens = 0.0
        worst = float("inf")
        for group, n in live:
            tokens += n * group[d]
            worst = min(worst, group[d])
        if floor is not None and worst * costs[0] < floor * cost:
            continue
        rate = tokens / cost
        if rate > best_rate * (1 + TIE):
            best, best_rate = d, rate
    drafts = tuple(
        best > 0 and n > 0 and g[best] > 1.0 for g, (_, n) in zip(gains, groups, strict=True)
    )
    return StepDepth(best, drafts, best_rate)
