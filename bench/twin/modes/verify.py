"""Adaptive verification: each step verifies a budget of drafts picked by their confidence.

`vllm-av` is vLLM 0.33's `enable_adaptive_verification` as shipped (PR 52228;
`vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`,
`acceptance_estimator.py`): every request drafted at K, one online acceptance
estimator pooled over every request (cold start slope 0.5, bias -0.2), the step's
budget and each request's admitted drafts from `engine.verify_budget`, and each
request verifying only its admitted drafts inside the step (varlen verify).
`gateway-av` is the gateway steering it: each request's cap is its class's depth
from the real control plane (`bench.twin.modes.adaptive`, 0 = verify nothing), one
estimator per class (the gateway's fix for vLLM issue 57533), the drafter skipped in
a step where every request's cap is 0, and the controller fed every step and
outcome as in `adaptive`.

Both price a step with the profile's parts (`bench.twin.step_parts`: the drafter at
n requests plus the target at the step's tokens) and hand the same tables to the
rule. Nothing here decides a budget: `BudgetedVerification.price` gathers the
inputs, `engine.verify_budget.admitted_drafts` answers. The budget counts the
decoding requests (each samples a token) and their one token each; a newcomer's
prefill is priced apart by the engine (`bench.twin.engine`).

Per step (`price`, then the engine runs the step, then `decode`): each decoding
request's features at its position (`TwinRequest.confidence`) go through its
estimator to conditional acceptances q; the budget reads the previous step's q of
the same request (vLLM's one-step-stale copy; 1.0 for a request's first decode
step), the ranking this step's; a request verifying a drafts accepts
min(run, a) (the acceptance draw), and its estimator grades the accepted drafts
and the first rejected one (`AcceptanceEstimator.observe`).
"""

from __future__ import annotations

from bench.twin.costs import StepCosts
from bench.twin.engine import Plan, VirtualClock
from bench.twin.live import Live
from bench.twin.modes.adaptive import AdaptiveControl
from bench.twin.modes.static import EngineWide
from bench.twin.requests import TwinRequest
from bench.twin.schema import Workload
from bench.twin.step_parts import StepParts
from engine.acceptance_estimator import AcceptanceEstimator, ClassEstimators
from engine.verify_budget import admitted_drafts

VLLM_AV = "vllm-av"
GATEWAY_AV = "gateway-av"


class BudgetedVerification:
    """The engine's verification of a step under adaptive verification (module docstring)."""

    def __init__(
        self, parts: StepParts, costs: StepCosts, pooled: bool, skip_idle_drafter: bool
    ) -> None:
        self._parts = parts
        self._no_spec = costs.no_spec
        self._skip_idle = skip_idle_drafter
        self.k = parts.max_k
        self.estimators = ClassEstimators(self.k, pooled)
        self._step: list[tuple[list[float], list[float], AcceptanceEstimator]] = []
        self._admitted: list[int] = []
        #: Steps whose budget bound (admitted fewer drafts than the caps), and drafts
        #: admitted against scheduled, for the notes.
        self.trimmed_steps = 0
        self.admitted = 0
        self.scheduled = 0

    def price(self, running: list[Live]) -> tuple[float, int, int, int]:
        """(seconds, the drafter's depth, requests with a cap > 0, drafts admitted) of a
        step over `running`, choosing each request's admitted drafts."""
        b = len(running)
        k = self.k
        confidences: list[list[float]] = []
        stale: list[list[float]] = []
        caps: list[int] = []
        step = self._step = []
        of = self.estimators.of
        for live in running:
            cap = live.k
            if cap > k:
                cap = k
            caps.append(cap)
            if cap == 0:
                step.append(([], [], of(live.request.class_index)))
                confidences.append([])
                stale.append([])
                continue
            f = live.features()[live.pos][:cap]
            estimator = of(live.request.class_index)
            q = estimator.predict(f)
            step.append((f, q, estimator))
            confidences.append(q)
            before = live.predicted
            if len(before) >= cap:
                stale.append(before if len(before) == cap else before[:cap])
            else:
                stale.append([*before, *[1.0] * (cap - len(before))])
        scheduled = sum(caps)
        if scheduled == 0 and self._skip_idle:
            self._admitted = caps
            return self._no_spec[b], 0, 0, 0
        # vLLM's drafter drafts K for all; the gateway's engine drafts its deepest cap.
        depth = max(caps) if self._skip_idle else k
        curves = self._parts.curves(b, depth)
        admitted = admitted_drafts(confidences, caps, curves, b, b, budget_confidences=stale)
        self._admitted = admitted
        total = sum(admitted)
        self.scheduled += scheduled
        self.admitted += total
        self.trimmed_steps += total < scheduled
        drafting = sum(1 for cap in caps if cap)
        return curves.step_ms(b, b + total) / 1000.0, depth, drafting, total

    def decode(self, running: list[Live], done: list[Live]) -> int:
        """Verify the step `price` chose; returns the drafts accepted, summed."""
        total = 0
        for live, a_max, (f, q, estimator) in zip(running, self._admitted, self._step, strict=True):
            pos = live.pos
            a = live.runs[pos]
            if a > a_max:
                a = a_max
            live.joint[a_max * live.width + a] += 1
            if f:
                estimator.observe(f, q, a, a_max)
                live.predicted = q
            total += a
            pos += a + 1
            if pos >= live.out:
                pos = live.out
                done.append(live)
            live.pos = pos
        self.estimators.end_step()
        return total

    def notes(self) -> dict[str, float]:
        return {
            "admitted_share": self.admitted / self.scheduled if self.scheduled else 0.0,
            "estimators": self.estimators.count,
        }


class VllmAdaptiveVerification(EngineWide):
    """`vllm-av`: every request drafted at K, verified per the pooled budget."""

    engine_wide = False

    def __init__(self, parts: StepParts, costs: StepCosts) -> None:
        self.verification = BudgetedVerification(parts, costs, pooled=True, skip_idle_drafter=False)
        self._k = parts.max_k

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        return Plan(self._k)


class GatewayAdaptiveVerification(AdaptiveControl):
    """`gateway-av`: the control plane's per-class depth as each request's cap, one
    estimator per class, the drafter skipped where every cap is 0."""

    def __init__(
        self,
        workload: Workload,
        parts: StepParts,
        costs: StepCosts,
        clock: VirtualClock,
        seed: int,
        queue_weight: float = 0.0,
    ) -> None:
        super().__init__(workload, costs, clock, seed, queue_weight=queue_weight)
        self.verification = BudgetedVerification(parts, costs, pooled=False, skip_idle_drafter=True)

    def prefills_drafter(self, k: int) -> bool:
        # The drafter drafts the whole batch in any step some request drafts in.
        return True
