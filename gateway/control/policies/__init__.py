"""Speculation policies, one module each, built by name."""

from __future__ import annotations

from gateway.control.policies.base import Choice, Policy, PolicyInput
from gateway.control.policies.goodput import GoodputPolicy
from gateway.control.policies.static import StaticPolicy
from gateway.control.settings import ControllerSettings

__all__ = ["Choice", "GoodputPolicy", "Policy", "PolicyInput", "StaticPolicy", "make_policy"]


def make_policy(name: str, settings: ControllerSettings) -> Policy:
    """The policy called `name` (`goodput` or `static`), parameterised from settings."""
    if name == "goodput":
        return GoodputPolicy(settings.min_samples, settings.hysteresis, settings.min_dwell)
    if name == "static":
        return StaticPolicy(settings.default_k)
    raise ValueError(f"unknown policy {name!r}; known: goodput, static")
