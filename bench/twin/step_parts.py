"""A step's cost as its two parts: the drafter's by request count, the target's by token count.

vLLM 0.33's adaptive verification prices a step as draft(n) + verify(t), n the
requests in the step and t its tokens (`engine.verify_budget.CostCurves`), the
drafter always drafting K. The shipped profiles hold whole steps
(`batch_stats[b][k]`, every request drafting and verifying k), so the parts are
derived from them, per batch size b:

    s(b)     = (step(b, K) - step(b, k0)) / (K - k0)   a draft's cost, drafter and verify
    h(b)     = step(b, 0) - no_spec(b)                 one drafter pass (its KV pass at k = 0)
    delta(b) = min(h(b), s(b))                        a draft's drafter step: one such pass
    v(b)     = s(b) - delta(b)                         a draft's verify, per request
    verify(b, t) = no_spec(b) + (t - b) v(b) / b      t tokens, t >= b
    draft(b, d)  = step(b, d) - verify(b, b (d + 1))   the drafter drafting d (KV pass included)

with k0 = 0. The assumption is that a drafter step costs one drafter forward of the
batch (the KV pass measured at k = 0); the measured Llama shape agrees at batch 1
(its first-token extra, the drafter's chain alone, is 0.43 ms a draft against
h = 0.46). Where the profile's k = 0 skips the drafter (`zero_skips_drafter`, the
CPU engine) there is no pass to read; k0 = 1 and a draft's verify is the target's
marginal token, v(b) = min(s(b), (no_spec(b (K + 1)) - no_spec(b)) / K): a CPU's
forward is compute-bound, its cost set by the token count. By construction a uniform
step at d costs exactly `batch_stats[b][d]` and a step that verifies nothing costs
draft(b, d) + no_spec(b).
The twin prices adaptive verification's steps with these parts and hands the same
tables to the budget rule (as if vLLM's start-up profile had measured every size of
this batch; vLLM's own verify curve is by token count alone).
"""

from __future__ import annotations

from bench.twin.schema import Profile
from engine.verify_budget import CostCurves


class StepParts:
    """`curves(b)`: the cost tables of a step of b requests, in ms (module docstring)."""

    def __init__(self, profile: Profile, max_requests: int) -> None:
        k = profile.max_k
        k0 = 1 if profile.zero_skips_drafter and k > 1 else 0
        self.max_k = k
        self._no_spec = [0.0]
        self._per_draft = [0.0]
        for b in range(1, max_requests + 1):
            full, base, no_spec = (
                profile.step_ms(b, k),
                profile.step_ms(b, k0),
                profile.no_spec_ms(b),
            )
            s = (full - base) / (k - k0)
            if k0:
                # No drafter pass at k = 0 to read: the target's marginal token instead.
                v = min(s, (profile.no_spec_ms(b * (k + 1)) - no_spec) / k)
            else:
                v = s - min(max(base - no_spec, 0.0), s)
            self._no_spec.append(no_spec)
            self._per_draft.append(v)
        #: draft[d][n]: the drafter drafting d for n requests, step(n, d) less its target.
        self.draft_ms = tuple(
            tuple(
                0.0
                if n == 0 or d == 0
                else max(0.0, profile.step_ms(n, d) - self._no_spec[n] - d * self._per_draft[n])
                for n in range(max_requests + 1)
            )
            for d in range(k + 1)
        )
        self._curves: dict[tuple[int, int], CostCurves] = {}

    def verify_ms(self, batch: int, tokens: int) -> float:
        """The target over `tokens` >= `batch` tokens of `batch` requests."""
        return self._no_spec[batch] + (tokens - batch) * self._per_draft[batch] / batch

    def curves(self, batch: int, depth: int) -> CostCurves:
        """Tables for a step of `batch` requests whose drafter drafts `depth`: the drafter
        by request count, the target by token count (below `batch` priced as `batch`)."""
        found = self._curves.get((batch, depth))
        if found is None:
            top = batch * (self.max_k + 1)
            verify = tuple(self.verify_ms(batch, max(t, batch)) for t in range(top + 1))
            found = CostCurves(self.draft_ms[depth], verify)
            self._curves[batch, depth] = found
        return found
