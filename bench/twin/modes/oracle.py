"""The per-class hindsight oracle: each class, in each phase, at its best static depth.

From the static runs of the same requests (`static-k0..K`, the speculative engine it
runs on; `nospec` stands for depth 0 only where `static-k0` did not run), the oracle
takes for every (class, phase) the depth whose run gave that class its highest
speed in that phase (class output tokens over its summed request latency; ties to
the shallower depth), then runs every
request at its (class, phase) depth on the speculative engine
(`PerRequestDepths`). It knows what no online controller can (the phases and the
measured outcome of every depth), but not the batch: the depths were best when
every class ran at them, not beside each other.
"""

from __future__ import annotations

from collections.abc import Mapping

from bench.twin.metrics import class_phase_speeds
from bench.twin.modes.static import PerRequestDepths
from bench.twin.records import RunResult


def static_depth(mode: str) -> int | None:
    """The depth of a static mode's name (`nospec` -> 0, `static-k3` -> 3), else None."""
    if mode == "nospec":
        return 0
    if mode.startswith("static-k") and mode[len("static-k") :].isdigit():
        return int(mode[len("static-k") :])
    return None


def choose(results: Mapping[str, RunResult]) -> dict[tuple[int, int], int]:
    """(class index, phase) -> the static depth that served it fastest."""
    best: dict[tuple[int, int], tuple[float, int]] = {}
    for mode in sorted(results, key=lambda m: (static_depth(m) or 0, m != "nospec", m)):
        depth = static_depth(mode)
        if depth is None or (mode == "nospec" and "static-k0" in results):
            continue
        for key, speed in sorted(class_phase_speeds(results[mode].records).items()):
            if key not in best or speed > best[key][0] * (1 + 1e-12):
                best[key] = (speed, depth)
    return {key: depth for key, (_, depth) in best.items()}


def oracle(choice: Mapping[tuple[int, int], int]) -> PerRequestDepths:
    return PerRequestDepths(lambda r: choice.get((r.class_index, r.phase), 0), fixed_depths=True)
