"""What the controller tells observers: decision changes, drifts, evicted classes.

Metrics, tracing and logging subscribe through `ControlEvents`; the controller
never imports them. Events fire on changes only (never per request), so an
observer may do I/O-free work such as incrementing a counter or logging a line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol

from gateway.control.classify import RequestClass

log = logging.getLogger("specgw.control")


@dataclass(frozen=True, slots=True)
class DecisionChange:
    """The adaptive k of a class at a batch bucket changed."""

    class_id: str
    label: str
    bucket: int
    old_k: int
    new_k: int
    reason: str
    #: Expected goodput (tokens per unit of step-0 cost) per k at this bucket.
    goodput: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class DriftEvent:
    """A change point in a class's acceptance; the estimate was shortened to re-converge."""

    class_id: str
    label: str
    #: +1 acceptance went up, -1 it went down.
    direction: int
    length_before: float
    length_after: float
    profile_before: tuple[float, ...]
    profile_after: tuple[float, ...]
    samples: int


class ControlEvents(Protocol):
    def on_decision_change(self, change: DecisionChange) -> None: ...

    def on_drift(self, event: DriftEvent) -> None: ...

    def on_class_evicted(self, cls: RequestClass) -> None: ...


class LoggingEvents:
    """The default observer: one structured log line per event."""

    def on_decision_change(self, change: DecisionChange) -> None:
        log.info(
            "k change class=%s label=%s bucket=%d %d->%d reason=%s",
            change.class_id,
            change.label,
            change.bucket,
            change.old_k,
            change.new_k,
            change.reason,
        )

    def on_drift(self, event: DriftEvent) -> None:
        log.info(
            "drift class=%s label=%s direction=%+d length %.2f->%.2f profile %s->%s",
            event.class_id,
            event.label,
            event.direction,
            event.length_before,
            event.length_after,
            event.profile_before,
            event.profile_after,
        )

    def on_class_evicted(self, cls: RequestClass) -> None:
        log.info("class evicted class=%s label=%s", cls.class_id, cls.label)


class FanOutEvents:
    """Several observers behind one (metrics + tracing + logging)."""

    def __init__(self, *observers: ControlEvents) -> None:
        self._observers = observers

    def on_decision_change(self, change: DecisionChange) -> None:
        for observer in self._observers:
            observer.on_decision_change(change)

    def on_drift(self, event: DriftEvent) -> None:
        for observer in self._observers:
            observer.on_drift(event)

    def on_class_evicted(self, cls: RequestClass) -> None:
        for observer in self._observers:
            observer.on_class_evicted(cls)
