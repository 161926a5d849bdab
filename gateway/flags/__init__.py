"""Ops feature flags through OpenFeature: file defaults, Redis overrides, a cached view."""

from gateway.flags.admin import AuditEntry, FlagAdmin, FlagOverride
from gateway.flags.overrides import Target
from gateway.flags.redis_provider import RedisOverrideProvider
from gateway.flags.settings import FlagSettings
from gateway.flags.values import SPECS, ControllerMode, FlagValueError, FlagValues, coerce
from gateway.flags.view import FlagView

__all__ = [
    "SPECS",
    "AuditEntry",
    "ControllerMode",
    "FlagAdmin",
    "FlagOverride",
    "FlagSettings",
    "FlagValueError",
    "FlagValues",
    "FlagView",
    "RedisOverrideProvider",
    "Target",
    "coerce",
]
