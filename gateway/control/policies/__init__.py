"""Speculation policies, one module each, built by name from `POLICIES`.

A policy is a module with a class that meets `Policy` (`base.py`: `inputs`,
`choose`, `score`, `observe`, `forget`; `BasePolicy` has the defaults) and a
`SPEC = PolicySpec(ParamsModel, factory)`; registering it is one line here.
`ControllerSettings.policy` accepts the names registered here.

There is no `static` policy: a fixed k is the `controller-mode: static` flag
(per class or as the default flag), which also skips exploration and the batch
rules, as a baseline must.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gateway.control.policies import goodput
from gateway.control.policies.base import (
    BasePolicy,
    Choice,
    Policy,
    PolicyInput,
    PolicySpec,
    Situation,
)
from gateway.control.policies.goodput import GoodputPolicy

if TYPE_CHECKING:
    from gateway.control.settings import ControllerSettings

__all__ = [
    "POLICIES",
    "BasePolicy",
    "Choice",
    "GoodputPolicy",
    "Policy",
    "PolicyInput",
    "PolicySpec",
    "Situation",
    "make_policy",
]

#: Policy name -> its parameter model and factory.
POLICIES: dict[str, PolicySpec[Any]] = {
    "goodput": goodput.SPEC,
}


def make_policy(name: str, settings: ControllerSettings) -> Policy:
    """The policy called `name`, its parameters read from `settings` (`PolicySpec`)."""
    spec = POLICIES.get(name)
    if spec is None:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}")
    return spec.build(settings)
