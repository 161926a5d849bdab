"""The gateway's view of the speculation controller: plan a request, then report back.

`Planner` is what the service calls; `ControllerPlanner` adapts
`gateway.control.Controller` (classification, per-class estimation, goodput
policy, drift) plus the ops flags to it; static depths are a flag away
(`controller-mode: static`), so there is one planner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.interface import RequestOutcome
from gateway.control.controller import Controller
from gateway.control.decision import ControlOverrides, LoadSnapshot
from gateway.control.features import (
    IdentityCache,
    RequestFeatures,
    features_from_chat,
    features_from_completion,
)
from gateway.flags.values import FlagValues


@dataclass(frozen=True, slots=True)
class Plan:
    """What the gateway decided for one request, and why."""

    class_id: str
    label: str
    k: int
    reason: str
    #: The controller's own handles (class object, decision), passed back to `observe`.
    handle: Any = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Load:
    """Load at decision time: requests running in the engine and waiting for admission."""

    running: int
    queued: int


class Planner(Protocol):
    def plan_chat(self, body: dict[str, Any], prompt_tokens: int, load: Load) -> Plan: ...

    def plan_completion(self, prompt: str, prompt_tokens: int, load: Load) -> Plan: ...

    def observe(self, plan: Plan, outcome: RequestOutcome, load: Load) -> None: ...


class ControllerPlanner:
    """The adaptive controller behind the `Planner` seam, steered by the ops flags.

    `overrides` resolves the flags for a class (a cached dict lookup in `FlagView`);
    without flags the controller runs adaptive with its configured exploration.
    """

    def __init__(
        self,
        controller: Controller,
        overrides: Callable[[str, str], ControlOverrides | None] | None = None,
        identities: IdentityCache | None = None,
    ) -> None:
        self.controller = controller
        self._overrides = overrides
        self._identities = identities or IdentityCache()

    def _plan(self, features: RequestFeatures, load: Load) -> Plan:
        cls = self.controller.classify(features)
        overrides = self._overrides(cls.class_id, cls.label) if self._overrides else None
        decision = self.controller.decide(cls, LoadSnapshot(load.running, load.queued), overrides)
        return Plan(cls.class_id, cls.label, decision.k, decision.reason, (cls, decision))

    def plan_chat(self, body: dict[str, Any], prompt_tokens: int, load: Load) -> Plan:
        features = features_from_chat(
            body["messages"],
            body.get("tools"),
            body.get("tool_choice"),
            body.get("response_format"),
            prompt_tokens,
            self._identities,
        )
        return self._plan(features, load)

    def plan_completion(self, prompt: str, prompt_tokens: int, load: Load) -> Plan:
        return self._plan(features_from_completion(prompt, prompt_tokens, self._identities), load)

    def observe(self, plan: Plan, outcome: RequestOutcome, load: Load) -> None:
        cls, decision = plan.handle
        self.controller.observe(cls, decision, outcome, LoadSnapshot(load.running, load.queued))


def overrides_from_flags(values: FlagValues) -> ControlOverrides:
    return ControlOverrides(
        enabled=values.enabled,
        mode=values.mode,
        pin_k=values.pin_k,
        k_min=values.k_min,
        k_max=values.k_max,
        exploration_share=values.exploration_share,
    )
