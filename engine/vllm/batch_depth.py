"""How many drafts each request of one engine step verifies: the batch-depth rule.

Two rules, chosen once per engine from the platform and the compilation config:

* `per-request` (the CPU, CUDA without a separate FULL decode graph): each request
  verifies exactly its own k; the drafter is asked for the step's largest k.
* `uniform` (CUDA with `FULL_AND_PIECEWISE` or `FULL_DECODE_ONLY` graphs, vLLM's
  default): every request with k > 0 verifies the same depth d, the largest k in
  the step rounded up to a depth the runner captured a FULL decode graph for;
  k = 0 requests verify none.

Why uniform on CUDA (vLLM 0.33, read in its code):
* A FULL decode graph is replayed only for a batch whose requests all have the
  same query length (`vllm/v1/worker/utils.py: get_uniform_decode_token_count`,
  matched in `vllm/v1/worker/gpu/cudagraph_utils.py: CudaGraphManager.dispatch`
  via `_is_compatible`), and graphs are captured only for widths 1 + K, plus
  1 + k for each k of a batch-size schedule under Model Runner V2
  (`CudaGraphManager._init_candidates`, `decode_query_lens`); the V1 runner's
  dispatcher knows 1 + K only (`vllm/v1/cudagraph_dispatcher.py`,
  `uniform_decode_query_len`). A step whose widths differ, or whose common width
  was not captured, runs PIECEWISE (attention outside the graph) or, under
  `FULL_DECODE_ONLY`, eagerly.
* Model Runner V2's drafter drafts the step's depth for every request of the
  batch (`vllm/v1/worker/gpu/spec_decode/target_dependent_ar/speculator.py:
  TargetDependentARSpeculator.propose`, `num_speculative_tokens` for all
  `num_reqs`), and replays its fused multi-step FULL graph only for depths
  captured from K and the schedule (`.../target_dependent_ar/cudagraph_utils.py:
  SpeculatorCudaGraphManager.specialize_spec_tokens`); others run eagerly.
  Verifying fewer drafts for a request than the step drafted saves only its
  verify tokens, which a memory-bound decode step barely notices, and costs the
  FULL graph. So a request's k > 0 is its vote for the step's depth.
* vLLM's own padding of new decode requests to 1 + K (`Scheduler.schedule`,
  "preserve full cudagraph") is off here: the depth cap keeps a constant
  batch-size schedule so that a resumed request is not padded to K
  (`engine.vllm.scheduler`), and this rule makes the step uniform instead.

A step mixing k = 0 and k > 0 requests is not uniform and runs without the FULL
decode graph; the scheduler counts such steps (`specgw_mixed_steps`) and the step
clock prices them in the step's own cost, which is what the controller reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class BatchDepthPolicy(StrEnum):
    PER_REQUEST = "per-request"
    UNIFORM = "uniform"


#: CUDA graph modes whose decode batches replay a FULL graph of one query width
#: (a separate decode routine): vLLM's `CUDAGraphMode.separate_routine()` with a
#: FULL `decode_mode()`.
UNIFORM_DECODE_MODES = frozenset({"FULL_AND_PIECEWISE", "FULL_DECODE_ONLY"})
#: `additional_config` key that forces a policy (operators, tests).
POLICY_OVERRIDE_KEY = "specgw_batch_depth"
#: `additional_config` key: the most drafts asked for in a step whose requests are all
#: still prefilling (`DepthRule.first_step_depth`; default 1, null = no cap).
FIRST_STEP_KEY = "specgw_first_step_depth"
#: `additional_config` key: the most drafts asked for in a step in which any request is
#: still prefilling, decoding requests beside it or not (`DepthRule.prefill_step_depth`;
#: default null = no cap: only all-prefill steps are capped).
PREFILL_STEP_KEY = "specgw_prefill_step_depth"
#: `additional_config` key: the batch-size schedule is the gateway's, there only so that
#: Model Runner V2 captures every width (`capture_schedule`), not a per-batch-size ceiling.
CAPTURE_SCHEDULE_KEY = "specgw_capture_schedule"


def request_counts(max_reqs: int, ceiling_reqs: int = 512) -> list[int]:
    """vLLM 0.33's grid of request counts a uniform decode width is captured at
    (`VllmConfig._set_cudagraph_sizes`, `request_counts`): 1, 2, 4, then every 8 to 256,
    then every 16, and `max_reqs` itself."""
    top = min(max_reqs, ceiling_reqs)
    counts = [n for n in (1, 2, 4) if n <= top]
    counts += list(range(8, min(top + 1, 256), 8))
    counts += list(range(256, top + 1, 16))
    return sorted({*counts, top})


def capture_schedule(max_depth: int, max_num_seqs: int) -> list[list[int]]:
    """A batch-size schedule whose every depth 0..K appears, for capture only.

    Model Runner V2 captures a FULL decode graph of width 1 + k for each k of the dense
    schedule (`vllm/v1/worker/gpu/cudagraph_utils.py: _init_candidates`,
    `decode_query_lens`) and its drafter's fused decode for each k >= 2
    (`target_dependent_ar/cudagraph_utils.py: capture`); without a schedule only width
    1 + K. Width 1 (k = 0) is what a step of k = 0 requests replays. Which batch size
    carries which k does not matter: the depth cap replaces the lookup with K
    (`CAPTURE_SCHEDULE_KEY`), and `capture_sizes` gives every width its batch sizes.
    """
    depths = list(range(max_depth, -1, -1))
    rows = [[b, b, k] for b, k in enumerate(depths[:-1], start=1)]
    last = len(rows) + 1
    rows.append([last, max(last, max_num_seqs), 0])
    return rows


def capture_sizes(max_depth: int, max_num_seqs: int, ceiling: int) -> list[int]:
    """Token counts to capture so that every width 1 + k, k in 0..K, has FULL graphs at
    vLLM's grid of request counts (`request_counts`) up to `ceiling` tokens (vLLM's
    platform default: 512, 1024 on Blackwell; `VllmConfig._set_cudagraph_sizes`)."""
    return sorted(
        {
            n * width
            for width in range(1, max_depth + 2)
            for n in request_counts(max_num_seqs)
            if n * width <= ceiling
        }
    )


def vllm_default_sizes(
    max_depth: int, max_num_seqs: int, schedule: Iterable[Sequence[int]], ceiling: int
) -> list[int]:
    """The capture sizes vLLM 0.33 picks itself (`VllmConfig._set_cudagraph_sizes`):
    1, 2, 4, every 8 to 256, every 16 to the ceiling, and each decode tier's width times
    `request_counts` of its widest batch (the tiers: each k of the dense schedule, or
    K alone without one)."""
    sizes = [n for n in (1, 2, 4) if n <= ceiling]
    sizes += list(range(8, min(ceiling + 1, 256), 8)) + list(range(256, ceiling + 1, 16))
    widest = {max_depth + 1: max_num_seqs}
    rows = sorted((int(lo), int(hi), int(k)) for lo, hi, k in schedule)
    if rows:
        widest = {}
        for lo, hi, k in rows:
            if lo <= max_num_seqs:
                widest[min(k, max_depth) + 1] = min(hi, max_num_seqs)
        last_hi, last_k = rows[-1][1], rows[-1][2]
        if last_hi < max_num_seqs:  # vLLM carries the last k to the largest batch
            widest[min(last_k, max_depth) + 1] = max_num_seqs
    for width, top in widest.items():
        sizes += [n * width for n in request_counts(top) if n * width <= ceiling]
    return sorted(set(sizes))


def full_batches(depths: Iterable[int], sizes: Iterable[int], max_num_seqs: int) -> dict[int, int]:
    """Depth -> the largest batch whose decode step at that depth has a FULL graph: a
    captured token count that is a multiple of the width 1 + d (a batch pads up to it)."""
    captured = sorted(set(sizes))
    out: dict[int, int] = {}
    for depth in depths:
        width = depth + 1
        fits = [s // width for s in captured if s % width == 0 and s // width <= max_num_seqs]
        if fits:
            out[depth] = max(fits)
    return out


@dataclass(frozen=True, slots=True)
class DepthRule:
    """The rule of one engine: its policy, K and the depths with a FULL decode graph."""

    policy: BatchDepthPolicy
    max_depth: int
    captured: tuple[int, ...] = ()
    first_step_cap: int | None = 1
    #: The same cap for a step that also decodes (None: such a step runs its depth).
    prefill_step_cap: int | None = None
    #: Depth -> the largest batch with a FULL graph at that depth (None: not limited, or
    #: not known); a depth whose graphs stop below the step's batch is not "captured"
    #: there (`captured_at`).
    full_batch: dict[int, int] | None = None
    #: A depth-0 step skips the drafter (`engine.vllm.draft_skip`: the V1 runner), so a
    #: request that may draft later must not sit out a step at 0; Model Runner V2 runs
    #: its drafter's KV pass in every step but one no request drafts in, now or later
    #: (`draft_skip.DRAFTER_IDLE`).
    zero_skips_drafter: bool = True

    def captured_at(self, batch: int) -> tuple[int, ...]:
        """The depths with a FULL decode graph at this batch size (vLLM captures up to
        a token ceiling, so wide batches lose the deep widths first)."""
        if self.full_batch is None:
            return self.captured
        return tuple(d for d in self.captured if self.full_batch.get(d, 0) >= batch)

    def step_depth(self, wanted: Sequence[int]) -> int:
        """Drafts to ask the drafter for in a step whose requests want `wanted`."""
        deepest = max(wanted, default=0)
        if self.policy is BatchDepthPolicy.PER_REQUEST or deepest <= 0:
            return deepest
        captured = self.captured_at(len(wanted))
        if not captured:  # no width has a FULL graph at this batch: any depth runs alike
            return deepest
        # Deeper than any width captured at this batch: the request's own depth, without
        # the graph (rounding down would cut drafts it asked for).
        return min((d for d in captured if d >= deepest), default=deepest)

    def first_step_depth(self, step_depth: int) -> int:
        """Drafts to ask for in a step in which every request is still prefilling.

        Such a step's drafts are verified only in each request's next step, but they are
        drafted before its first token leaves the step: K - 1 autoregressive draft
        passes on the time to the first token. Depth 1 is the drafter's prefill pass
        alone (it proposes the first draft and keeps the drafter's KV complete); the
        second step then verifies one draft and drafts the request's k, so the request
        gives up E(k) - E(1) tokens once. Under the uniform rule the depth is the
        shallowest with a FULL decode graph, so that second step keeps its graph.
        """
        return self._capped(step_depth, self.first_step_cap)

    def prefill_step_depth(self, step_depth: int) -> int:
        """Drafts to ask for in a step in which some request is prefilling beside others
        that decode.

        The newcomer's first token (or its next prompt chunk) leaves only after the
        step's draft passes, so a deep batch puts K - 1 of them on its time to the first
        token; capped, the decoding requests verify fewer drafts in their next step
        (E(k) - E(cap) tokens each, once per such step) and the step is that much
        shorter. A trade of throughput for TTFT, off unless configured
        (`PREFILL_STEP_KEY`).
        """
        return self._capped(step_depth, self.prefill_step_cap)

    def _capped(self, step_depth: int, cap: int | None) -> int:
        if cap is None or step_depth <= cap:
            return step_depth
        if self.policy is BatchDepthPolicy.PER_REQUEST:
            return cap
        return min((d for d in self.captured if cap <= d <= step_depth), default=step_depth)

    def drafts_for(self, k: int, step_depth: int) -> int:
        """Drafts a request of depth k verifies in a step of `step_depth`."""
        if self.policy is BatchDepthPolicy.PER_REQUEST:
            return min(k, step_depth)
        return step_depth if k > 0 else 0

    def is_mixed(self, wanted: Sequence[int]) -> bool:
        """A uniform-rule step that cannot be one width: k = 0 beside k > 0."""
        return (
            self.policy is BatchDepthPolicy.UNIFORM
            and any(k == 0 for k in wanted)
            and any(k > 0 for k in wanted)
        )


def select_policy(device_type: str, cudagraph_mode: str, enforce_eager: bool) -> BatchDepthPolicy:
    """`uniform` where decode steps replay FULL graphs of one width, else `per-request`."""
    if device_type == "cuda" and not enforce_eager and cudagraph_mode in UNIFORM_DECODE_MODES:
        return BatchDepthPolicy.UNIFORM
    return BatchDepthPolicy.PER_REQUEST


def captured_depths(
    max_depth: int, schedule_depths: Iterable[int], v2_runner: bool
) -> tuple[int, ...]:
    """Depths with a FULL decode graph: K, and under V2 each k > 0 of the schedule."""
    depths = {max_depth}
    if v2_runner:
        depths |= {k for k in schedule_depths if 0 < k <= max_depth}
    return tuple(sorted(depths))


def rule_for(vllm_config: Any, device_type: str, schedule_depths: Iterable[int] = ()) -> DepthRule:
    """The rule for a resolved vLLM config (duck-typed: no vLLM import here).

    `schedule_depths`: the depths of the batch-size schedule the operator configured
    (`num_speculative_tokens_per_batch_size`), whose widths V2 captures.
    """
    spec = getattr(vllm_config, "speculative_config", None)
    max_depth = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec else 0
    extra = getattr(vllm_config, "additional_config", None)
    if not isinstance(extra, dict):
        extra = {}
    forced = extra.get(POLICY_OVERRIDE_KEY)
    if forced is not None:
        policy = BatchDepthPolicy(forced)
    else:
        mode = getattr(vllm_config.compilation_config, "cudagraph_mode", None)
        mode_name = str(getattr(mode, "name", mode))
        eager = bool(getattr(vllm_config.model_config, "enforce_eager", False))
        policy = select_policy(device_type, mode_name, eager)
    v2 = bool(getattr(vllm_config, "use_v2_model_runner", False))
    captured = captured_depths(max_depth, schedule_depths, v2)
    sizes = getattr(vllm_config.compilation_config, "cudagraph_capture_sizes", None) or []
    max_seqs = int(getattr(getattr(vllm_config, "scheduler_config", None), "max_num_seqs", 0))
    batches = None
    if policy is BatchDepthPolicy.UNIFORM and sizes and max_seqs:
        batches = full_batches(captured, sizes, max_seqs)
    return DepthRule(
        policy,
        max_depth,
        captured,
        _cap(extra.get(FIRST_STEP_KEY, 1)),
        _cap(extra.get(PREFILL_STEP_KEY)),
        full_batch=batches,
        zero_skips_drafter=not v2,
    )


def _cap(value: Any) -> int | None:
    """A step cap from `additional_config`: null = none, else at least one draft."""
    return None if value is None else max(1, int(value))


__all__ = [
    "CAPTURE_SCHEDULE_KEY",
    "FIRST_STEP_KEY",
    "POLICY_OVERRIDE_KEY",
    "PREFILL_STEP_KEY",
    "UNIFORM_DECODE_MODES",
    "BatchDepthPolicy",
    "DepthRule",
    "capture_schedule",
    "capture_sizes",
    "captured_depths",
    "full_batches",
    "request_counts",
    "rule_for",
    "select_policy",
    "vllm_default_sizes",
]
