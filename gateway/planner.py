"""The gateway's view of the speculation controller: plan a request, then report back.

`Planner` is what the service calls; `ControllerPlanner` adapts
`gateway.control.Controller` (classification, per-class estimation, goodput
policy, drift) plus the ops flags to it. `StaticPlanner` serves one configured
k for every request and is what a controller-less configuration gets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.interface import RequestOutcome


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


class StaticPlanner:
    """One k for every request; classes are not told apart."""

    def __init__(self, k: int) -> None:
        self.k = k

    def plan_chat(self, body: dict[str, Any], prompt_tokens: int, load: Load) -> Plan:
        return Plan("static", "static", self.k, "static")

    def plan_completion(self, prompt: str, prompt_tokens: int, load: Load) -> Plan:
        return Plan("static", "static", self.k, "static")

    def observe(self, plan: Plan, outcome: RequestOutcome, load: Load) -> None:
        return None
