"""TensorRT-LLM's acceptance gate: speculation off for good below a rolling acceptance rate.

TensorRT-LLM's `SpeculationGate` (`acceptance_rate_window_size`, `acceptance_rate_threshold`,
NVIDIA/TensorRT-LLM PR 12905) records one sample per speculation-enabled decoding
iteration, the batch's true acceptance rate accepted drafts / drafted tokens, and
once it has `window` samples disables speculation permanently as soon as their
rolling mean falls below the threshold. TensorRT-LLM ships no default for either
(nor for `max_draft_len`), so the twin sets them as an operator would:
`max_draft_len = 3` (its EAGLE-3 examples), a window of 128 iterations, and the
threshold at break-even for that depth at batch 1 on the profile,

    threshold = (step_ms(1, k) / no_spec_ms(1) - 1) / k,

the acceptance rate below which k drafts a step lose to no speculation. Disabled,
the engine keeps its drafter loaded and runs its steps at k = 0 (the profile's
k = 0 cost) and prefills no drafter.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from bench.twin.engine import LiveRequest
from bench.twin.modes.static import EngineWide
from bench.twin.schema import Profile

#: TensorRT-LLM's EAGLE-3 examples draft 3 tokens.
DRAFT_LEN = 3
#: Speculation-enabled iterations in the rolling mean.
WINDOW = 128


def break_even_rate(profile: Profile, k: int) -> float:
    """Acceptance rate at which k drafts a step match no speculation at batch 1."""
    rate = (profile.step_ms(1, k) / profile.no_spec_ms(1) - 1.0) / k
    return min(max(rate, 0.0), 1.0)


class AcceptanceGate(EngineWide):
    """Engine-wide depth `k` until the rolling acceptance rate trips the gate."""

    def __init__(self, k: int, threshold: float, window: int = WINDOW) -> None:
        self.k = k
        self.threshold = threshold
        self.window = window
        self._history: deque[float] = deque()
        self._sum = 0.0
        self._samples = 0
        self.disabled = False
        #: Iterations recorded when the gate tripped (None: never).
        self.tripped_at: int | None = None

    def step_depth(self, batch: int, running: Sequence[LiveRequest] = ()) -> int:
        return 0 if self.disabled else self.k

    def prefills_drafter(self, k: int) -> bool:
        return not self.disabled

    def verified(self, batch: int, depth: int, accepted: int) -> None:
        if self.disabled or depth <= 0:
            return
        rate = accepted / (batch * depth)
        self._history.append(rate)
        self._sum += rate
        if len(self._history) > self.window:
            self._sum -= self._history.popleft()
        self._samples += 1
        if self._samples >= self.window and self._sum / len(self._history) < self.threshold:
            self.disabled = True
            self.tripped_at = self._samples
