"""SGLang's adaptive speculative decoding: an EMA of accepted drafts picks a depth tier,
per batch-size slot.

As SGLang documents it (docs "Adaptive speculative decoding"; sglang PR 21599 and
PR 23336; `python/sglang/srt/speculative/adaptive_spec_params.py`): after each
verify pass the batch's mean accepted drafts per request feeds an EMA (alpha 0.2)
of the slot serving that batch size (slot keys 1, 8, 32, 64; a batch uses the
largest key <= its size); after `warmup_batches` (10) and then every
`update_interval` (5) verify passes the slot moves between its candidate tiers:

    target ~ clamp(round(ema) + 1, tiers): down one tier while ema <= tier_below - 0.5
    + down_hysteresis (0.5 + hysteresis for the tier 0), else up while ema > tier - 0.5
    + up_hysteresis; a slot at 0 probes its next tier at each update.

The default tiers (`DEFAULT_ADAPTIVE_CONFIG`) are [1, 3, 5, 7] at batch 1,
[0, 1, 3] from 8, [0, 1] from 32 and [0] from 64, with down hysteresis -0.25 at
batch 1 and 0 elsewhere; tiers beyond the profile's K are capped at K. The
initial depth is 3 (`--speculative-num-steps 3` in its examples), snapped to each
slot's tiers (the middle tier where 3 is not one). Every request prefills the
drafter (the engine's drafter is always on).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from bench.twin.engine import LiveRequest
from bench.twin.modes.static import EngineWide

#: slot key -> (candidate tiers, down hysteresis, up hysteresis): SGLang's defaults.
DEFAULT_SLOTS: dict[int, tuple[tuple[int, ...], float, float]] = {
    1: ((1, 3, 5, 7), -0.25, 0.0),
    8: ((0, 1, 3), 0.0, 0.0),
    32: ((0, 1), 0.0, 0.0),
    64: ((0,), 0.0, 0.0),
}
EMA_ALPHA = 0.2
WARMUP_BATCHES = 10
UPDATE_INTERVAL = 5
INITIAL_STEPS = 3


@dataclass(slots=True)
class TierSlot:
    """One batch-size slot: its tiers, EMA and current tier."""

    tiers: tuple[int, ...]
    down_hysteresis: float
    up_hysteresis: float
    current: int
    ema: float
    batches: int = 0

    @classmethod
    def start(cls, tiers: tuple[int, ...], down: float, up: float, initial: int) -> TierSlot:
        current = initial if initial in tiers else tiers[len(tiers) // 2]
        return cls(tiers, down, up, current, float(current - 1))

    def update(self, mean_accepted: float) -> None:
        if self.current > 0:
            self.ema = (1 - EMA_ALPHA) * self.ema + EMA_ALPHA * mean_accepted
        self.batches += 1
        if self.batches <= WARMUP_BATCHES:
            return
        if (self.batches - WARMUP_BATCHES) % UPDATE_INTERVAL == 0:
            self._recompute()

    def _recompute(self) -> None:
        i = self.tiers.index(self.current)
        if self.current == 0:
            target = self.tiers[min(i + 1, len(self.tiers) - 1)]
            if target > 0 and self.ema < 0:
                self.ema = float(target - 1)
            self.current = target
            return
        start = i
        while i > 0:
            below = self.tiers[i - 1]
            drop = (0.5 if below == 0 else below - 0.5) + self.down_hysteresis
            if self.ema <= drop:
                i -= 1
            else:
                break
        if i == start:
            while i < len(self.tiers) - 1 and self.ema > self.tiers[i] - 0.5 + self.up_hysteresis:
                i += 1
        self.current = self.tiers[i]


class EmaTiers(EngineWide):
    """SGLang-style adaptive depth: one `TierSlot` per batch-size key."""

    def __init__(self, max_k: int, initial: int = INITIAL_STEPS) -> None:
        self.keys = sorted(DEFAULT_SLOTS)
        self.slots = [
            TierSlot.start(
                tuple(sorted({min(t, max_k) for t in tiers})), down, up, min(initial, max_k)
            )
            for tiers, down, up in (DEFAULT_SLOTS[key] for key in self.keys)
        ]

    def slot(self, batch: int) -> TierSlot:
        return self.slots[max(0, bisect.bisect_right(self.keys, batch) - 1)]

    def step_depth(self, batch: int, running: Sequence[LiveRequest] = ()) -> int:
        return self.slot(batch).current

    def verified(self, batch: int, depth: int, accepted: int) -> None:
        self.slot(batch).update(accepted / batch)
