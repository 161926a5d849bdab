"""The ops flags as the control plane reads them: `ControlOverrides` per class.

`gateway.control.plane.ControlPlane` takes an `overrides(class_id, label)` callable;
`FlagOverrides` is that callable on the flag view, cached per resolved flag values.
Static depths are a flag away (`controller-mode: static`).
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.control.decision import ControlOverrides
from gateway.flags.values import FlagValues


class FlagOverrides:
    """The controller's overrides for a class, from the flag view's resolved values.

    The view caches `FlagValues` per class until a flag changes; the
    `ControlOverrides` built from them is cached against that same object, so the
    request path builds nothing while the flags hold.
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
