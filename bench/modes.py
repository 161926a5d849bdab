"""The modes compared in one run, and how each is applied.

A mode is a gateway configuration (which engine: no drafter, the EAGLE 3.1
drafter, vLLM's batch-size schedule) plus the ops flags written into the
gateway's `flags.json`. Modes sharing a configuration share one process, so
static k = 1..K and k = 0 run on the very same engine. The adaptive modes each
have their own (same engine configuration): the runner interleaves repeats across
modes, and a controller sharing the static modes' process would learn from their
traffic between its own repeats.

| mode | engine | flags |
|---|---|---|
| `no-spec` | no drafter | - |
| `k0` | drafter | static, pin-k 0 (the cost of a speculative engine at k = 0) |
| `static-kN` | drafter | static, pin-k N, for every class |
| `batch-schedule` | drafter + `num_speculative_tokens_per_batch_size` | static, no pin |
| `adaptive` | drafter (own process: learns from its own traffic only) | adaptive |
| `adaptive-floor` | drafter (own process: cold controller) | adaptive, `batch-floor` 0.98 |

Named with `--mode` only (A/B runs of one mechanism of the adaptive controller,
not part of `make bench`), each in its own process as `adaptive` is:

| mode | flags |
|---|---|
| `adaptive-nolower` | adaptive, `batch-lower` false |
| `adaptive-noride` | adaptive, `batch-ride` false |
| `adaptive-step` | adaptive, step rule on (`SPECGW_CONTROL_STEP_RULE=on`; off on CPU by default) |
| `adaptive-prior` | adaptive, a new class at the prior's best k (`SPECGW_CONTROL_COLD_START`) |
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from bench.gateway_proc import GatewayConfig

#: vLLM's dynamic-SD schedule for the baseline: deep drafts when the batch is small,
#: shallow when it is large ([lo, hi, k] rows, batch sizes inclusive).
BATCH_SCHEDULE: list[list[int]] = [[1, 1, 4], [2, 4, 3], [5, 8, 2], [9, 1024, 1]]
BATCH_SCHEDULE_FIELD = "spec_tokens_per_batch_size"
BATCH_SCHEDULE_ENV = "SPECGW_ENGINE_SPEC_TOKENS_PER_BATCH_SIZE"
#: The controller setting that turns the engine's step-depth rule on for `adaptive-step`.
STEP_RULE_ENV = "SPECGW_CONTROL_STEP_RULE"
#: The controller setting that starts a new class at the prior's best k for `adaptive-prior`.
COLD_START_ENV = "SPECGW_CONTROL_COLD_START"
#: `batch-floor` of the adaptive-floor mode: the claim "no class below 0.98x".
FLOOR = 0.98


@dataclass(frozen=True, slots=True)
class Mode:
    name: str
    gateway: GatewayConfig
    flags: dict[str, Any] = field(default_factory=dict)
    #: The k every request must report (static modes), checked before the mode is timed.
    expect_k: int | None = None

    @property
    def static_k(self) -> int | None:
        """N for a static-kN mode (the oracle's candidates), else None."""
        return self.expect_k if self.name.startswith("static-k") else None


def batch_schedule_supported() -> bool:
    """Whether the engine settings can carry vLLM's batch-size schedule (`BATCH_SCHEDULE`)."""
    from engine.settings import EngineSettings

    return BATCH_SCHEDULE_FIELD in EngineSettings.model_fields


def default_modes(max_depth: int, batch_schedule: bool = True) -> list[Mode]:
    """In the order each repeat runs them; every configuration starts once."""
    spec = GatewayConfig("spec", drafter=True, max_depth=max_depth)
    nospec = GatewayConfig("nospec", drafter=False, max_depth=max_depth, default_k=0)
    modes = [Mode("no-spec", nospec, {"speculation-enabled": False})]
    if batch_schedule:
        sched = GatewayConfig(
            "batch-schedule",
            drafter=True,
            max_depth=max_depth,
            default_k=max_depth,
            env={BATCH_SCHEDULE_ENV: json.dumps(BATCH_SCHEDULE)},
        )
        modes.append(Mode("batch-schedule", sched, {"controller-mode": "static", "pin-k": -1}))
    adaptive = GatewayConfig("spec-adaptive", drafter=True, max_depth=max_depth)
    floor = GatewayConfig("spec-floor", drafter=True, max_depth=max_depth)
    floor_flags = {"controller-mode": "adaptive", "pin-k": -1, "batch-floor": FLOOR}
    modes.append(Mode("adaptive-floor", floor, floor_flags))
    modes.append(Mode("adaptive", adaptive, {"controller-mode": "adaptive", "pin-k": -1}))
    modes.append(Mode("k0", spec, {"controller-mode": "static", "pin-k": 0}, expect_k=0))
    modes += [
        Mode(f"static-k{n}", spec, {"controller-mode": "static", "pin-k": n}, expect_k=n)
        for n in range(1, max_depth + 1)
    ]
    return modes


def ab_modes(max_depth: int) -> list[Mode]:
    """The adaptive controller with one mechanism off: run only when named (`--mode`)."""
    adaptive = {"controller-mode": "adaptive", "pin-k": -1}
    step = GatewayConfig("spec-step", drafter=True, max_depth=max_depth, env={STEP_RULE_ENV: "on"})
    prior = GatewayConfig(
        "spec-prior", drafter=True, max_depth=max_depth, env={COLD_START_ENV: "prior"}
    )
    return [
        *(
            Mode(
                f"adaptive-no{name}",
                GatewayConfig(f"spec-no{name}", drafter=True, max_depth=max_depth),
                {**adaptive, f"batch-{name}": False},
            )
            for name in ("lower", "ride")
        ),
        Mode("adaptive-step", step, adaptive),
        Mode("adaptive-prior", prior, adaptive),
    ]


def select_modes(
    modes: list[Mode], names: list[str] | None, named_only: list[Mode] | None = None
) -> list[Mode]:
    """`modes` (all of them without `names`), or those named, in run order; `named_only`
    run only when named, after `modes`."""
    if not names:
        return modes
    modes = modes + (named_only or [])
    known = {m.name: m for m in modes}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown modes {unknown}; known: {sorted(known)}")
    wanted = set(names)
    return [m for m in modes if m.name in wanted]
