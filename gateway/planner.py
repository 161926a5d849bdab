"""The gateway's view of the speculation controller: plan a request, then report back.

`Planner` is what the service calls; `ControllerPlanner` adapts
`gateway.control.Controller` (classification, per-class estimation, goodput
policy, drift) plus the ops flags to it; static depths are a flag away
(`controller-mode: static`), so there is one planner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

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


class Plan(NamedTuple):
    """What the gateway decided for one request, and why.

    A NamedTuple: one per request, and a frozen dataclass costs a microsecond more
    to build (issue 5's 20 us decision budget).
    """

    class_id: str
    label: str
    k: int
    reason: str
    #: The controller's own handles (class object, decision), passed back to `observe`.
    handle: Any = None
    #: Expected tokens per step were the batch to run at depth D (`BatchLoad.enter`).
    gains: tuple[float, ...] = ()
    #: The class's `batch-floor` flag: what it keeps when a deeper request joins (0 = off).
    floor: float = 0.0
    #: Lower the requests in flight to at most this depth as this one enters (None: no).
    cap: int | None = None
    #: The depth its class chose, where it rides deeper at the batch's (None: k).
    anchor: int | None = None
    #: Its k is an operator's (`SpeculationDecision.fixed`): no newcomer lowers it.
    fixed: bool = False


#: Load at decision time (requests running in the engine, waiting for admission): the
#: controller's own value type, so the service builds one object that passes through.
Load = LoadSnapshot


class Planner(Protocol):
    """`sampling`: "" for a greedy request, else its temperature's bucket
    (`gateway.control.features.sampling_bucket`)."""

    def plan_chat(
        self, body: dict[str, Any], prompt_tokens: int, load: Load, sampling: str = ""
    ) -> Plan: ...

    def plan_completion(
        self, prompt: str, prompt_tokens: int, load: Load, sampling: str = ""
    ) -> Plan: ...

    def observe(self, plan: Plan, outcome: RequestOutcome, load: Load) -> None: ...

    def observe_step(self, batch: int, depth: int, seconds: float) -> None: ...


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

    def plan_features(self, features: RequestFeatures, load: Load) -> Plan:
        """Classify, resolve the class's flags, decide k: the request path after parsing."""
        cls = self.controller.classify(features)
        overrides = self._overrides(cls.class_id, cls.label) if self._overrides else None
        decision = self.controller.decide(cls, load, overrides)
        return Plan(
            cls.class_id,
            cls.label,
            decision.k,
            decision.reason,
            (cls, decision),
            decision.gains,
            overrides.batch_floor if overrides is not None else 0.0,
            decision.batch_cap,
            decision.anchor,
            decision.fixed,
        )

    def plan_chat(
        self, body: dict[str, Any], prompt_tokens: int, load: Load, sampling: str = ""
    ) -> Plan:
        features = features_from_chat(
            body["messages"],
            body.get("tools"),
            body.get("tool_choice"),
            body.get("response_format"),
            prompt_tokens,
            self._identities,
            sampling,
        )
        return self.plan_features(features, load)

    def plan_completion(
        self, prompt: str, prompt_tokens: int, load: Load, sampling: str = ""
    ) -> Plan:
        features = features_from_completion(prompt, prompt_tokens, self._identities, sampling)
        return self.plan_features(features, load)

    def observe(self, plan: Plan, outcome: RequestOutcome, load: Load) -> None:
        cls, decision = plan.handle
        self.controller.observe(cls, decision, outcome, load)

    def observe_step(self, batch: int, depth: int, seconds: float) -> None:
        self.controller.observe_step(batch, depth, seconds)


class FlagOverrides:
    """The controller's overrides for a class, from the flag view's resolved values.

    The view caches `FlagValues` per class until a flag changes; the
    `ControlOverrides` built from them is cached against that same object, so the
    request path builds nothing while the flags hold (issue 5: decision <= 20 us).
    """

    def __init__(self, lookup: Callable[[str, str], FlagValues], max_entries: int = 4096) -> None:
        self._lookup = lookup
        self._max = max_entries
        self._built: dict[tuple[str, str], tuple[FlagValues, ControlOverrides]] = {}

    def __call__(self, class_id: str, label: str) -> ControlOverrides:
        values = self._lookup(class_id, label)
        key = (class_id, label)
        hit = self._built.get(key)
        if hit is not None and hit[0] is values:
            return hit[1]
        if len(self._built) >= self._max:
            self._built.clear()
        overrides = overrides_from_flags(values)
        self._built[key] = (values, overrides)
        return overrides


def overrides_from_flags(values: FlagValues) -> ControlOverrides:
    return ControlOverrides(
        enabled=values.enabled,
        mode=values.mode,
        pin_k=values.pin_k,
        k_min=values.k_min,
        k_max=values.k_max,
        exploration_share=values.exploration_share,
        batch_floor=values.batch_floor,
        batch_ride=values.batch_ride,
        batch_lower=values.batch_lower,
    )
