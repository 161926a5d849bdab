"""The speculation controller: request classes, live acceptance, the k per request.

Pure Python (no FastAPI, no vLLM, no torch; an import-linter contract enforces
it). The gateway builds one `Controller` in its composition root and calls
`classify`, `decide` and `observe`; see README.md for the formulas.
"""

from gateway.control.classify import OTHER, RequestClass
from gateway.control.controller import COST_ID, ControlDeltas, Controller
from gateway.control.decision import (
    ControlMode,
    ControlOverrides,
    LoadSnapshot,
    SpeculationDecision,
)
from gateway.control.events import (
    ControlEvents,
    DecisionChange,
    DriftEvent,
    FanOutEvents,
    LoggingEvents,
)
from gateway.control.features import (
    IdentityCache,
    RequestFeatures,
    features_from_chat,
    features_from_completion,
)
from gateway.control.report import ClassReport
from gateway.control.settings import ControllerSettings

__all__ = [
    "COST_ID",
    "OTHER",
    "ClassReport",
    "ControlDeltas",
    "ControlEvents",
    "ControlMode",
    "ControlOverrides",
    "Controller",
    "ControllerSettings",
    "DecisionChange",
    "DriftEvent",
    "FanOutEvents",
    "IdentityCache",
    "LoadSnapshot",
    "LoggingEvents",
    "RequestClass",
    "RequestFeatures",
    "SpeculationDecision",
    "features_from_chat",
    "features_from_completion",
]
