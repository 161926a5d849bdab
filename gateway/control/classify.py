"""Request classes: a stable id, a short label, and a bound on how many are live.

The id is a blake2b hash of the canonical features, so every replica and every
restart names a class the same (Redis keys and flags target it); the label is
what a human reads in metrics and `/admin/classes`. At most `max_classes` are
live: a new class evicts the least-recently-used one only if that one has been
idle for `class_idle_s`, otherwise the request folds into `other`. Metric label
cardinality is therefore bounded by `max_classes + 1` under adversarial input.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.control.features import RequestFeatures

OTHER_ID = "other"


@dataclass(frozen=True, slots=True)
class RequestClass:
    """A class of requests: what the controller tracks and decides for."""

    class_id: str
    label: str
    features: RequestFeatures | None = field(default=None, compare=False)

    @property
    def is_other(self) -> bool:
        return self.class_id == OTHER_ID


OTHER = RequestClass(OTHER_ID, OTHER_ID, None)


def class_id_of(features: RequestFeatures) -> str:
    """Stable id: 16 hex digits of blake2b over the canonical features."""
    return hashlib.blake2b(features.canonical().encode(), digest_size=8).hexdigest()


def label_of(features: RequestFeatures) -> str:
    """Short human label, e.g. `chat/sys:ab12/tools/json_object/len:512/t1`
    (`RequestFeatures.label`)."""
    return features.label()


class Classifier:
    """Maps features to a live class; LRU-bounded, with a cache for identical features."""

    def __init__(
        self,
        max_classes: int,
        idle_s: float,
        cache_size: int,
        clock: Callable[[], float],
        on_evict: Callable[[RequestClass], None] | None = None,
    ) -> None:
        self._max = max_classes
        self._idle_s = idle_s
        self._cache_size = cache_size
        self._clock = clock
        self._on_evict = on_evict
        #: class id -> (class, last seen); order = least recently used first.
        self._live: OrderedDict[str, tuple[RequestClass, float]] = OrderedDict()
        self._cache: dict[RequestFeatures, RequestClass] = {}
        self.folded = 0

    def __len__(self) -> int:
        return len(self._live)

    def live(self) -> list[RequestClass]:
        return [entry[0] for entry in self._live.values()]

    def classify(self, features: RequestFeatures) -> RequestClass:
        """The live class of these features, or `other` when the table is full."""
        now = self._clock()
        cls = self._cache.get(features)
        if cls is not None:
            cid = cls.class_id
            if cid in self._live:
                self._live[cid] = (cls, now)
                self._live.move_to_end(cid)
                return cls
        else:
            cls = RequestClass(class_id_of(features), label_of(features), features)
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[features] = cls
        return self._admit(cls, now)

    def _admit(self, cls: RequestClass, now: float) -> RequestClass:
        if cls.class_id in self._live:
            self._live[cls.class_id] = (cls, now)
            self._live.move_to_end(cls.class_id)
            return cls
        if len(self._live) >= self._max:
            oldest_id, (oldest, seen) = next(iter(self._live.items()))
            if now - seen < self._idle_s:
                self.folded += 1
                return OTHER
            del self._live[oldest_id]
            if self._on_evict is not None:
                self._on_evict(oldest)
        self._live[cls.class_id] = (cls, now)
        return cls

    def restore(self, cls: RequestClass) -> None:
        """Make a class live without a request (warm start from shared state), if room."""
        if cls.class_id not in self._live and len(self._live) < self._max:
            self._live[cls.class_id] = (cls, self._clock())


def similarity(a: RequestFeatures, b: RequestFeatures) -> int:
    """How many of six coarse traits two classes share (cold start from a similar class)."""
    score = int(a.template == b.template)
    score += int(a.system_id == b.system_id)
    score += int(a.tools == b.tools and a.tool_choice == b.tool_choice)
    score += int(a.tool_messages == b.tool_messages)
    score += int(a.response_format == b.response_format)
    score += int(max(a.length, b.length) <= 2 * min(a.length, b.length))
    return score
