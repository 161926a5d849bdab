"""Local, additive per-class deltas waiting to be pushed to Redis.

The controller's per-class statistics are additive sufficient statistics
(counts, sums, per-position counters), so deltas recorded while Redis is away
merge into one entry per class instead of growing a queue: what is retained is
bounded by the number of classes, not by the length of the outage.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(slots=True)
class ClassDelta:
    """Counter increments and latest metadata of one class since the last push."""

    counters: dict[str, float] = field(default_factory=dict)
    meta: dict[str, str] = field(default_factory=dict)

    def add(self, counters: Mapping[str, float], meta: Mapping[str, str] | None) -> None:
        for name, inc in counters.items():
            self.counters[name] = self.counters.get(name, 0.0) + float(inc)
        if meta:
            self.meta.update(meta)

    def absorb(self, newer: ClassDelta) -> None:
        """Fold a later delta into this one (metadata: the later value wins)."""
        self.add(newer.counters, newer.meta)


@dataclass(frozen=True, slots=True)
class ClassSnapshot:
    """Cluster-wide totals of one class as last read from Redis."""

    counters: Mapping[str, float]
    meta: Mapping[str, str]


class DeltaBuffer:
    """Pending deltas by class id, with a bound on how many classes it holds."""

    def __init__(self, max_classes: int) -> None:
        self._max_classes = max_classes
        self._by_class: dict[str, ClassDelta] = {}
        self.outcomes = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self._by_class)

    def __bool__(self) -> bool:
        return bool(self._by_class)

    def items(self) -> list[tuple[str, ClassDelta]]:
        return list(self._by_class.items())

    def get(self, class_id: str) -> ClassDelta | None:
        return self._by_class.get(class_id)

    def add(
        self,
        class_id: str,
        counters: Mapping[str, float],
        meta: Mapping[str, str] | None = None,
        outcomes: int = 1,
    ) -> bool:
        """Accumulate; False (and counted in `dropped`) if a new class would exceed the bound."""
        entry = self._by_class.get(class_id)
        if entry is None:
            if len(self._by_class) >= self._max_classes:
                self.dropped += 1
                return False
            entry = self._by_class[class_id] = ClassDelta()
        entry.add(counters, meta)
        self.outcomes += outcomes
        return True

    def take(self) -> dict[str, ClassDelta]:
        """Hand over everything pending and start empty."""
        taken, self._by_class = self._by_class, {}
        self.outcomes = 0
        return taken
