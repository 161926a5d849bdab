"""A profile's step costs as lookup tables in seconds, built once per run.

The engine reads one step cost per step; interpolating the profile there would
cost more than the rest of the step's work, so every (batch, depth) the engine
can meet is computed up front (`Profile.step_ms` for the formulas).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, replace

import numpy as np

from bench.twin.schema import Profile

#: The resolution of a mixed step's share of k = 0 requests in `StepCosts.mixed`.
MIXED_SHARES = 64
#: Step-time multipliers drawn per run (`with_noise`); step i of a run reads entry
#: i mod this, so every mode's i-th step gets the same jitter (common random numbers).
NOISE_STEPS = 1 << 16
#: Correlation length, in steps, of the host's slow speed drift (`with_noise`): a shared
#: host's step times move by up to a quarter within minutes, some 10,000 steps of 10 ms.
DRIFT_STEPS = 10_000


@dataclass(frozen=True, slots=True)
class StepCosts:
    """Seconds: `spec[b][k]` (speculative engine, b decoding, deepest k), `no_spec[b]`,
    prefill per prompt token, and the first-token extra per depth; `noise`: each
    step's time multiplier by step index (`(1.0,)`: none)."""

    max_k: int
    spec: tuple[tuple[float, ...], ...]
    no_spec: tuple[float, ...]
    prefill_target_s: float
    prefill_drafter_s: float
    first_extra_s: tuple[float, ...]
    noise: tuple[float, ...] = (1.0,)
    #: Per-request depths verify the step's deepest k, k = 0 none (`Profile.batch_depth`).
    uniform: bool = False
    #: A step at depth 0 skips the drafter (`Profile.zero_skips_drafter`).
    zero_skips_drafter: bool = False

    #: A depth-0 step whose requests may draft later (the step rule's votes held at 0),
    #: where `spec[b][0]` is a step no request drafts in (`on_gateway`); None: as
    #: `zero_skips_drafter` says (`engine._step`).
    held_zero: tuple[float, ...] | None = None
    #: `mixed[b][d][i]`: a step of b requests at depth d of which about i / MIXED_SHARES
    #: are at k = 0 costs `spec[b][d]` times this (`Profile.mixed_step`); None: times 1.
    mixed: tuple[tuple[tuple[float, ...], ...], ...] | None = None

    @property
    def idle_skips_drafter(self) -> bool:
        """The gateway's engine on a profile whose k = 0 keeps the drafter's pass (Model
        Runner V2, `on_gateway`): a step no request drafts in, now or later, skips the
        drafter whole, its newcomers' drafter prefill included; any other step runs it
        over every request in the step."""
        return self.held_zero is not None

    def mixed_factor(self, batch: int, depth: int, zeros: int) -> float:
        """The multiple of `spec[batch][depth]` a step with `zeros` requests at k = 0
        beside drafting ones costs (1 where the profile does not price mixed steps)."""
        if self.mixed is None or not 0 < zeros < batch or depth == 0:
            return 1.0
        return self.mixed[batch][depth][round(MIXED_SHARES * zeros / batch)]

    def on_gateway(self) -> StepCosts:
        """These costs as the gateway's engine pays them. Its steps in which no request
        drafts, now or later, skip the drafter on either model runner
        (`engine/vllm/draft_skip.py`), so where the profile's k = 0 still runs the
        drafter's KV pass, such a step costs the step without a drafter; a step the step
        rule holds at depth 0 keeps the pass (Model Runner V2), at the profile's k = 0."""
        if self.zero_skips_drafter:
            return self
        spec = tuple((zero, *row[1:]) for zero, row in zip(self.no_spec, self.spec, strict=True))
        return replace(self, spec=spec, held_zero=tuple(row[0] for row in self.spec))

    @classmethod
    def of(cls, profile: Profile, max_running: int) -> StepCosts:
        k_max = profile.max_k
        batches = range(max_running + 1)
        spec = tuple(
            tuple(profile.step_ms(max(b, 1), k) / 1000.0 for k in range(k_max + 1)) for b in batches
        )
        no_spec = tuple(profile.no_spec_ms(max(b, 1)) / 1000.0 for b in batches)
        return cls(
            k_max,
            spec,
            no_spec,
            profile.prefill_ms_per_token.target / 1000.0,
            profile.prefill_ms_per_token.drafter / 1000.0,
            tuple(profile.first_token_extra(k) / 1000.0 for k in range(k_max + 1)),
            uniform=profile.batch_depth == "uniform",
            zero_skips_drafter=profile.zero_skips_drafter,
            mixed=None if profile.mixed_step is None else mixed_table(profile, max_running),
        )

    def with_noise(self, sigma: float, seed: int, drift: float = 0.0) -> StepCosts:
        """The same costs with lognormal step jitter: step i takes its profile time times
        exp(sigma z_i), z_i standard normal from `seed` (median 1, so the profile's
        figures stay the medians they are; sigma = the log-spread of measured step
        times, e.g. 0.05 for a 5 % spread). sigma = 0: no jitter.

        `drift` > 0 adds a host whose speed wanders: times exp(x_i) besides, x a
        first-order autoregression x_{i+1} = r x_i + sqrt(1 - r^2) drift w_i with
        r = exp(-1 / DRIFT_STEPS) (stationary log-spread `drift`, correlated over about
        DRIFT_STEPS steps), from its own draws of `seed`. The sequence wraps after
        NOISE_STEPS steps, where the speed jumps once."""
        if sigma <= 0 and drift <= 0:
            return replace(self, noise=(1.0,))
        draws = (
            np.random.default_rng([seed, 0x5157]).lognormal(0.0, sigma, NOISE_STEPS)
            if sigma > 0
            else np.ones(NOISE_STEPS)
        )
        if drift > 0:
            walk = np.random.default_rng([seed, 0xD41F]).normal(0.0, 1.0, NOISE_STEPS)
            r = math.exp(-1.0 / DRIFT_STEPS)
            scale = math.sqrt(1.0 - r * r) * drift
            logs = np.empty(NOISE_STEPS)
            x = float(walk[0]) * drift
            for i in range(NOISE_STEPS):
                logs[i] = x
                x = r * x + scale * float(walk[i])
            draws = draws * np.exp(logs)
        return replace(self, noise=tuple(float(x) for x in draws))


def mixed_table(profile: Profile, max_running: int) -> tuple[tuple[tuple[float, ...], ...], ...]:
    """`StepCosts.mixed` from `Profile.mixed_step`: linear in share, then depth, then batch
    between the measured points, the nearest measured value beyond them."""
    assert profile.mixed_step is not None
    ratio = profile.mixed_step.ratio
    shares = np.arange(MIXED_SHARES + 1) / MIXED_SHARES
    batches = sorted(ratio)
    by_batch = []
    for batch in batches:
        depths = sorted(ratio[batch])
        measured = np.stack(
            [np.interp(shares, sorted(ratio[batch][d]), _values(ratio[batch][d])) for d in depths]
        )
        by_batch.append(np.stack([_along(d, depths, measured) for d in range(profile.max_k + 1)]))
    grid = np.stack(by_batch)  # [measured batch, depth, share]
    return tuple(
        tuple(tuple(float(x) for x in row) for row in _along(b, batches, grid))
        for b in range(max_running + 1)
    )


def _values(points: dict[float, float]) -> list[float]:
    return [points[x] for x in sorted(points)]


def _along(x: float, points: list[int], values: np.ndarray) -> np.ndarray:
    """`values` (first axis: one entry per point) at x: linear between the neighbouring
    points, the nearest point's beyond them."""
    if x <= points[0] or x >= points[-1]:
        nearest: np.ndarray = values[0 if x <= points[0] else -1]
        return nearest
    j = bisect.bisect_right(points, x)
    a, b = points[j - 1], points[j]
    w = (x - a) / (b - a)
    between: np.ndarray = values[j - 1] * (1 - w) + values[j] * w
    return between
