"""How many of each request's drafts a step verifies: vLLM 0.33's draft budget, in pure Python.

The rule of vLLM 0.33's adaptive verification (PR 52228;
`vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`), kept free of torch so
that the engine's own scheduler and the twin (`bench.twin.modes.verify`) run the
same code. Per step, with q_{r,j} the predicted conditional acceptance of request
r's draft j (`engine.acceptance_estimator`):

    s_{r,j} = prod_{i <= j} q_{r,i}                         (survival, a running product)
    budget  = argmax_b (S + sum of the b best s) / (draft(n) + verify(T0 + b))

with S the requests that sample a token this step, n the requests in the step, T0
its tokens other than drafts (one per decoding request) and draft(.) / verify(.)
the drafter's cost by request count and the target's by token count
(`AdaptiveVerificationManager.get_num_tokens`). The step then admits the best
`budget` slots over the whole batch (`_assign_draft_token_budget`): survival
falls along a request, so each request's admitted drafts are a prefix of its
chain. Slots past a request's cap (its scheduled draft count; the gateway's class
bound, 0 = verify nothing) never compete.

vLLM sizes the budget from the previous step's copy of the confidences (a new
request's read 1.0: `record_confidences`, `add_request`) and ranks the slots on
the current ones; `admitted_drafts` takes both (`budget_confidences`).
vLLM also caps the budget at what its sampler verifies in one chunk
(`max_total_logits`, less one bonus token per request); that cap is not modelled here.
Ties: vLLM's argmax and top-k keep the first; here the first budget and, among
equal scores, the earlier request and position.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CostCurves:
    """A step's cost in ms as two tables: `draft_ms[n]` the drafter at n requests,
    `verify_ms[t]` the target's forward at t tokens (index 0 unused in both)."""

    draft_ms: Sequence[float]
    verify_ms: Sequence[float]

    def step_ms(self, requests: int, tokens: int) -> float:
        return self.draft_ms[requests] + self.verify_ms[tokens]


def cost_tables(
    draft_curve: Sequence[tuple[int, float]],
    verify_curve: Sequence[tuple[int, float]],
    max_requests: int,
    max_tokens: int,
) -> CostCurves:
    """Tables from profiled (size, ms) points as vLLM builds them without CUDA graphs
    (`build_cost_tables_from_curves` with `cudagraph_limit` 0): costs made monotone,
    each size priced at the next profiled size, linear beyond the last two; the drafter
    at least 0, the target at least 1e-6 ms."""
    return CostCurves(
        tuple(max(x, 0.0) for x in _table(draft_curve, max_requests)),
        tuple(max(x, 1e-6) for x in _table(verify_curve, max_tokens)),
    )


def _table(curve: Sequence[tuple[int, float]], limit: int) -> list[float]:
    points = sorted(curve)
    xs = [x for x, _ in points]
    ys: list[float] = []
    for _, y in points:
        ys.append(max(y, ys[-1]) if ys else y)
    out = []
    for size in range(limit + 1):
        if size > xs[-1] and len(xs) > 1:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            out.append(ys[-1] + slope * (size - xs[-1]))
        else:
            out.append(ys[min(bisect.bisect_left(xs, size), len(xs) - 1)])
    return out


def survival(confidences: Sequence[float], cap: int) -> list[float]:
    """The running product of the first `cap` conditional acceptances."""
    out = []
    s = 1.0
    for q in confidences[:cap]:
        s *= q
        out.append(s)
    return out


def step_budget(
    confidences: Sequence[Sequence[float]],
    caps: Sequence[int],
    costs: CostCurves,
    sampling_requests: int,
    non_draft_tokens: int,
) -> int:
    """The step's draft budget, `argmax_b (S + cumsum of the b best survivals) /
    (draft(n) + verify(T0 + b))` over b = 0..sum(caps) (vLLM `get_num_tokens`)."""
    scores: list[float] = []
    for q, cap in zip(confidences, caps, strict=True):
        s = 1.0
        for x in q[:cap]:
            s *= x
            scores.append(s)
    scores.sort(reverse=True)
    draft = costs.draft_ms[len(caps)]
    verify = costs.verify_ms
    gained = float(sampling_requests)
    best, best_rate = 0, gained / (draft + verify[non_draft_tokens])
    for b, score in enumerate(scores, start=1):
        gained += score
        rate = gained / (draft + verify[non_draft_tokens + b])
        if rate > best_rate:
            best, best_rate = b, rate
    return best


def assign_budget(
    confidences: Sequence[Sequence[float]], caps: Sequence[int], budget: int
) -> list[int]:
    """Each request's admitted drafts: the globally best `budget` survival slots, a
    prefix per request (vLLM `_assign_draft_token_budget`)."""
    if budget >= sum(caps):
        return list(caps)
    if len(caps) == 1:
        return [budget]
    slots = [
        (-s, r, j)
        for r, (q, cap) in enumerate(zip(confidences, caps, strict=True))
        for j, s in enumerate(survival(q, cap))
    ]
    slots.sort()
    admitted = [0] * len(caps)
    for _, r, _ in slots[:budget]:
        admitted[r] += 1
    return admitted


def admitted_drafts(
    confidences: Sequence[Sequence[float]],
    caps: Sequence[int],
    costs: CostCurves,
    sampling_requests: int,
    non_draft_tokens: int,
    budget_confidences: Sequence[Sequence[float]] | None = None,
) -> list[int]:
    """Each request's admitted draft count: the budget from `budget_confidences` (vLLM's
    one-step-stale copy; None: `confidences`), its slots ranked on `confidences`."""
    budget = step_budget(
        confidences if budget_confidences is None else budget_confidences,
        caps,
        costs,
        sampling_requests,
        non_draft_tokens,
    )
    return assign_budget(confidences, caps, budget)
