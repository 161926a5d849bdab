"""The speculation modes the twin compares, one module each, built by name (`build`).

`nospec`, `static-k0..K` (`static`), `vllm-schedule` (`vllm_schedule`),
`sglang-adaptive` (`sglang`), `trtllm-threshold` (`trtllm`), `adaptive` and
`adaptive-floor` (`adaptive`: the gateway's control plane), `adaptive-step`
(`adaptive_step`: the gateway with its `step_rule` on, one depth per step from
`engine.step_rule`; `adaptive-step-free` without its guard),
`upper-bound`
(`upper_bound`); `vllm-av` and `gateway-av` (`verify`: vLLM 0.33's adaptive
verification as shipped, and steered by the gateway); `oracle` (`oracle`) is built
from the static runs' results.
`batch-schedule` is the real-engine benchmark's fixed vLLM schedule
(`bench.modes.BATCH_SCHEDULE`), run beside it for the validation only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.twin.costs import StepCosts
from bench.twin.engine import DepthSource, VirtualClock
from bench.twin.modes.adaptive import FLOOR, AdaptiveControl
from bench.twin.modes.adaptive_step import GUARD, AdaptiveStep
from bench.twin.modes.sglang import EmaTiers
from bench.twin.modes.static import NoSpec, Static
from bench.twin.modes.trtllm import DRAFT_LEN, AcceptanceGate, break_even_rate
from bench.twin.modes.upper_bound import Clairvoyant
from bench.twin.modes.verify import (
    GATEWAY_AV,
    VLLM_AV,
    GatewayAdaptiveVerification,
    VllmAdaptiveVerification,
)
from bench.twin.modes.vllm_schedule import BatchSchedule, depth_table, marginals, table_of
from bench.twin.schema import Profile, Workload
from bench.twin.step_parts import StepParts

ADAPTIVE = "adaptive"
ADAPTIVE_FLOOR = "adaptive-floor"
ADAPTIVE_STEP = "adaptive-step"
#: `adaptive-step` without the guard (pure expected throughput per step).
ADAPTIVE_STEP_FREE = "adaptive-step-free"
#: The modes that drive the real control plane (their settling is measured).
CONTROLLED = (ADAPTIVE, ADAPTIVE_FLOOR, ADAPTIVE_STEP, ADAPTIVE_STEP_FREE, GATEWAY_AV)
#: Adaptive verification, as shipped and steered (`bench.twin.modes.verify`).
VERIFY_MODES = (VLLM_AV, GATEWAY_AV)
NOSPEC = "nospec"
ORACLE = "oracle"
UPPER_BOUND = "upper-bound"
VLLM = "vllm-schedule"
SGLANG = "sglang-adaptive"
TRTLLM = "trtllm-threshold"
#: The real-engine benchmark's own vLLM schedule (`bench.modes.BATCH_SCHEDULE`).
BENCH_SCHEDULE = "batch-schedule"
#: The engines' own adaptive modes and schedules, which adaptive must beat.
BASELINES = (VLLM, SGLANG, TRTLLM)


def static_modes(max_k: int) -> list[str]:
    return [NOSPEC, *(f"static-k{k}" for k in range(max_k + 1))]


def mode_names(max_k: int, extra: Sequence[str] = ()) -> list[str]:
    """Every mode of a run, in run order (the oracle after the static runs it reads)."""
    return [
        *static_modes(max_k),
        *BASELINES,
        *extra,
        ADAPTIVE,
        ADAPTIVE_FLOOR,
        ADAPTIVE_STEP,
        ADAPTIVE_STEP_FREE,
        *VERIFY_MODES,
        ORACLE,
        UPPER_BOUND,
    ]


#: Modes of the gateway's own engine, which skips the drafter in a step no request
#: drafts in (`StepCosts.on_gateway`); the static depths and the baselines run on the
#: profile's engine (vLLM's, whose k = 0 keeps the drafter's KV pass where the profile
#: says so).
GATEWAY_ENGINE = frozenset(
    {ADAPTIVE, ADAPTIVE_FLOOR, ADAPTIVE_STEP, ADAPTIVE_STEP_FREE, GATEWAY_AV, ORACLE, UPPER_BOUND}
)


@dataclass(frozen=True, slots=True)
class ModeContext:
    """What building a mode needs: the inputs, the cost tables, the clock and the seed."""

    profile: Profile
    workload: Workload
    costs: StepCosts
    clock: VirtualClock
    seed: int
    #: The goodput policy's queue weight in the controlled modes (0: the default, none).
    queue_weight: float = 0.0


def build(name: str, ctx: ModeContext) -> DepthSource:
    """The depth source of a mode by name (every mode but `oracle`)."""
    k_max = ctx.profile.max_k
    if name == NOSPEC:
        return NoSpec()
    if name.startswith("static-k"):
        return Static(int(name.removeprefix("static-k")))
    if name == VLLM:
        return BatchSchedule(depth_table(ctx.costs, marginals(ctx.profile, ctx.workload)))
    if name == BENCH_SCHEDULE:
        from bench.modes import BATCH_SCHEDULE

        return BatchSchedule(table_of(BATCH_SCHEDULE, len(ctx.costs.spec) - 1, k_max))
    if name == SGLANG:
        return EmaTiers(k_max)
    if name == TRTLLM:
        k = min(DRAFT_LEN, k_max)
        return AcceptanceGate(k, break_even_rate(ctx.profile, k))
    if name in (ADAPTIVE, ADAPTIVE_FLOOR):
        floor = FLOOR if name == ADAPTIVE_FLOOR else None
        return AdaptiveControl(
            ctx.workload, ctx.costs, ctx.clock, ctx.seed, floor, queue_weight=ctx.queue_weight
        )
    if name in (ADAPTIVE_STEP, ADAPTIVE_STEP_FREE):
        guard = GUARD if name == ADAPTIVE_STEP else None
        return AdaptiveStep(
            ctx.workload, ctx.costs, ctx.clock, ctx.seed, guard, queue_weight=ctx.queue_weight
        )
    if name == UPPER_BOUND:
        return Clairvoyant(ctx.costs)
    if name == VLLM_AV:
        return VllmAdaptiveVerification(StepParts(ctx.profile, len(ctx.costs.spec) - 1), ctx.costs)
    if name == GATEWAY_AV:
        parts = StepParts(ctx.profile, len(ctx.costs.spec) - 1)
        return GatewayAdaptiveVerification(
            ctx.workload, parts, ctx.costs, ctx.clock, ctx.seed, ctx.queue_weight
        )
    raise ValueError(f"unknown mode {name!r}")
