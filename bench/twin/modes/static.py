"""Depth sources with a fixed rule: no speculation, one static k, a k per request.

- `nospec`: an engine with no drafter (step costs `no_spec_step_ms`, no drafter prefill).
- `static-k<k>`: vLLM's `num_speculative_tokens = k`, engine-wide, every request
  drafts k and the drafter prefills every prompt (`static-k0` is that engine with
  k = 0: the drafter loaded, never drafting; vLLM issue 49548 measured 7 to 22 %
  TPOT for it).
- `PerRequestDepths`: each request at a depth given up front (the oracle's
  per-class choice); the step runs at the deepest, the drafter prefills requests
  at k > 0 only, as the gateway's engine does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bench.twin.engine import LiveRequest, Plan
from bench.twin.requests import TwinRequest
from engine.interface import EngineStep, RequestOutcome

if TYPE_CHECKING:
    from bench.twin.modes.verify import BudgetedVerification


class EngineWide:
    """Base of the modes that run one depth for every request in a step."""

    drafter = True
    engine_wide = True
    observes = False
    #: Every request keeps its plan's k for its life, the step runs at the deepest of them,
    #: and the mode reads nothing of the run (`verified`, `observe_step`, `finish` do
    #: nothing): the engine may replay it without asking it per step
    #: (`bench.twin.engine_fixed`).
    fixed_depths = False
    #: Its depth-0 steps hold requests that may draft in a later step (the step rule's
    #: votes): where depth 0 skips the drafter (`StepCosts.zero_skips_drafter`) the
    #: engine then drafts one, verified by none, and the step costs depth 1.
    drafts_once_at_zero = False
    #: Every request verifies the step's depth (`drafts`).
    bounded = False
    #: Adaptive verification prices and verifies each step (`bench.twin.modes.verify`).
    verification: BudgetedVerification | None = None

    def step_depth(self, batch: int, running: Sequence[LiveRequest] = ()) -> int:
        raise NotImplementedError

    def drafts(self, live: LiveRequest) -> bool:
        return True

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        return Plan(self.step_depth(running + 1))

    def enter(self, plan: Plan) -> None:
        return None

    def prefills_drafter(self, k: int) -> bool:
        return self.drafter

    def verified(self, batch: int, depth: int, accepted: int) -> None:
        return None

    def observe_step(self, step: EngineStep) -> None:
        return None

    def finish(self, plan: Plan, outcome: RequestOutcome | None) -> None:
        return None


class NoSpec(EngineWide):
    """No drafter at all: the baseline every class is compared against."""

    drafter = False
    fixed_depths = True

    def step_depth(self, batch: int, running: Sequence[LiveRequest] = ()) -> int:
        return 0


class Static(EngineWide):
    """One depth k for every request and step (vLLM `num_speculative_tokens`)."""

    fixed_depths = True

    def __init__(self, k: int) -> None:
        self.k = k

    def step_depth(self, batch: int, running: Sequence[LiveRequest] = ()) -> int:
        return self.k


class PerRequestDepths(EngineWide):
    """Each request at the depth `depth_of` gives it; the batch runs at the deepest."""

    engine_wide = False

    def __init__(
        self, depth_of: Callable[[TwinRequest], int], *, fixed_depths: bool = False
    ) -> None:
        self._depth_of = depth_of
        #: True where `depth_of` alone is the rule (no subclass changes a plan or reads
        #: the run): the engine may then replay it without asking per step.
        self.fixed_depths = fixed_depths

    def arrive(self, request: TwinRequest, running: int, queued: int) -> Plan:
        return Plan(self._depth_of(request))

    def prefills_drafter(self, k: int) -> bool:
        return k > 0
