"""vLLM schedulers that cap each request's draft tokens at its own depth k.

vLLM fixes `num_speculative_tokens` (K) per engine. A request carries its depth
k in `SamplingParams.extra_args[SPEC_DEPTH_ARG]` (missing = K, clamped to 0..K)
and these schedulers, passed as `scheduler_cls`, verify at most k drafts for it:

* Sync path (`SpecDepthScheduler`, what the CPU platform forces): drafts land in
  `update_draft_token_ids` after each step; we trim `request.spec_token_ids`,
  exactly where vLLM already trims drafts for structured output.
* Async path (`AsyncSpecDepthScheduler`, the GPU default): the scheduler books
  placeholder drafts in `_update_after_schedule` before the drafter has run, and
  the next step schedules as many spec tokens as there are placeholders; we cut
  each request's placeholders to k there. Real drafts arriving later through
  `update_draft_token_ids_in_output` are trimmed to the scheduled count by vLLM.

Both also shrink `SchedulerOutput.num_spec_tokens_to_schedule` (the knob vLLM's
dynamic-SD path uses; the model runner passes it to the drafter's `propose`) to
the largest k among the requests in the step, so a batch of only k = 0 requests
runs the drafter's single KV-sync pass and no autoregressive draft steps.

A step whose requests are all still prefilling asks for one draft, not the step's
depth (`DepthRule.first_step_depth`): its drafts would be verified only in the next
step, yet the first token waits for them (`python -m bench.floor_interleaved`). Configured, a
step that prefills beside decoding requests is capped likewise
(`DepthRule.prefill_step_depth`), trading the decoders' next verify for the newcomer's
first token.

A request may also carry `extra_args[SPEC_CAP_ARG]` = c: when it is added, every
request already in the scheduler is lowered to at most depth c for the rest of its
life (`_DepthCap._cap_in_flight`). A depth only ever goes down, so a request never
drafts again from drafter KV that steps at depth 0 skipped. Why: the batch's
deepest request sets every step's cost (`gateway.control.batch_load`), and a
request whose class may not be slowed below a floor of its own speed at k = 0
would otherwise pay for its deeper batch-mates until they finish: at concurrency 4
a 14-token long-context request lives about 0.2 s, a chat request beside it at
k = 3 about 0.5 s, so it would never see the batch come down.

Prefix caching keeps k = 0 requests apart (`_DepthCap.add_request`): with the
drafter skipped at depth 0 (`engine.vllm.draft_skip`), blocks a k = 0 request fills
hold target KV but no drafter KV, and a later k > 0 request reusing them drafts
from stale state (embedded model, the same 16 long prompts: mean acceptance
length 2.31 after a k = 0 run of the prompt, 2.57 without). So k = 0 requests
hash their blocks under their own salt, and since no drafter reads that
namespace, their hits skip vLLM's EAGLE rule of recomputing the last matched
block, which with the CPU's 128-token blocks gives a repeated 920-token prompt
4.5x the TTFT of an engine without a drafter (257 vs 57 ms; 60 ms with the salt,
`python -m bench.prefix_cache`). k > 0 hits keep the drop, which is why the CPU
default block is 32 tokens (`engine.vllm.engine`).

A request may carry a vote for the step-depth rule (`engine.vllm.step_votes`): then its
k is a bound, and the step's voters run at the rule's depth. Where a depth-0 step
skips the drafter (the V1 runner), a step whose voters the rule holds at depth 0 still
drafts one token (verified by none): the drafter's KV must stay complete for the deeper
steps that may follow.

Both also time each step for the gateway's cost model (`engine.vllm.step_clock`): the
period and what the step scheduled ride in the step's own scheduler stats.

With the verify budget on (`EngineSettings.verify_budget`, synchronous scheduling), the
drafts a request keeps after its k are trimmed further, before the next step is scheduled,
to what vLLM 0.33's adaptive-verification rule admits from the drafter's confidence in
each (`engine.vllm.confidence_budget`); the confidences are read from the worker where
the engine core picks up the step's drafts (`_skip_draft_pickup_in_depth_zero_steps`).

How the drafts of one step are spread over its requests is the engine's batch-depth
rule (`engine.vllm.batch_depth`): each request its own k on the CPU, one depth for every
drafting request where CUDA replays FULL decode graphs of one query width.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
from vllm.v1.request import Request

from engine.interface import SPEC_CAP_ARG, SPEC_CLASS_ARG, SPEC_DEPTH_ARG, depth_arg
from engine.vllm.batch_depth import CAPTURE_SCHEDULE_KEY, DepthRule, rule_for
from engine.vllm.confidence_budget import VERIFY_BUDGET_KEY, ConfidenceBudget, Draft
from engine.vllm.draft_skip import DRAFTER_IDLE
from engine.vllm.step_clock import StepClock
from engine.vllm.step_votes import StepVotes

log = logging.getLogger("specgw")

#: Appended to a k = 0 request's cache salt: its blocks lack drafter KV (see above).
DEPTH_ZERO_SALT = "specgw:k0"


def requested_depth(request: Request, max_depth: int) -> int:
    """A request's k: `extra_args[SPEC_DEPTH_ARG]`, missing = K, clamped to 0..K."""
    k = _depth_arg(request, SPEC_DEPTH_ARG, max_depth)
    return max_depth if k is None else k


def requested_cap(request: Request, max_depth: int) -> int | None:
    """The depth a request lowers the requests in flight to (`SPEC_CAP_ARG`), or None."""
    return _depth_arg(request, SPEC_CAP_ARG, max_depth)


def _depth_arg(request: Request, key: str, max_depth: int) -> int | None:
    """`extra_args[key]` as a depth clamped to 0..K; None when missing or not a number."""
    params = request.sampling_params
    value = depth_arg(params.extra_args if params is not None else None, key)
    return None if value is None else min(value, max_depth)


class _DepthCap(StepVotes):
    """Shared logic; mixed in before the vLLM scheduler class it specialises."""

    num_spec_tokens: int
    requests: dict[str, Request]
    dynamic_sd_lookup: list[int] | None

    #: Steps of the uniform rule that mixed k = 0 and drafting requests (no FULL graph).
    specgw_mixed_steps: int = 0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.specgw_depth_rule = self._depth_rule()
        #: Drafts asked for in the step last scheduled (what its drafts are cut against).
        self._specgw_step = self.num_spec_tokens
        if self.num_spec_tokens > 0 and (self.dynamic_sd_lookup is None or self._capture_only()):
            # A constant dynamic-SD schedule (K at every batch size) changes nothing
            # but one thing: vLLM then no longer pads a resumed or fully prefix-cached
            # request to K placeholder drafts (scheduler.py, `pad_spec_decode`), which
            # would verify K drafts for a request that asked for k < K.
            max_seqs = self.scheduler_config.max_num_seqs  # type: ignore[attr-defined]
            # The same where the schedule is the gateway's, there for Model Runner V2 to
            # capture every width (`batch_depth.capture_schedule`): no per-batch ceiling.
            self.dynamic_sd_lookup = [self.num_spec_tokens] * (max_seqs + 1)
        self._depth_zero_hits_whole_blocks()
        self._step_clock = StepClock()
        self._init_votes()
        self.specgw_verify_budget = self._verify_budget()

    def _verify_budget(self) -> ConfidenceBudget | None:
        """The confidence trim where the settings turned it on (synchronous scheduling:
        drafts reach the scheduler before the step that verifies them)."""
        extra = getattr(self.vllm_config, "additional_config", None)  # type: ignore[attr-defined]
        mode = extra.get(VERIFY_BUDGET_KEY) if isinstance(extra, dict) else None
        if mode not in ("on", "vllm-av") or self.num_spec_tokens <= 0:
            return None
        config: Any = self.scheduler_config  # type: ignore[attr-defined]
        if config.async_scheduling:
            # Asynchronous scheduling (CUDA): the step's drafts are not here before it is
            # scheduled, so the workers' adaptive verification takes the class bounds
            # instead (`engine.vllm.class_verification`).
            log.info("verify budget: in the workers' adaptive verification, not the scheduler")
            return None
        seqs = int(config.max_num_seqs)
        tokens = max(int(config.max_num_batched_tokens), seqs * (1 + self.num_spec_tokens))
        return ConfidenceBudget(self.num_spec_tokens, seqs, tokens, pooled=mode == "vllm-av")

    def _capture_only(self) -> bool:
        """Whether the batch-size schedule is the gateway's capture schedule."""
        extra = getattr(self.vllm_config, "additional_config", None)  # type: ignore[attr-defined]
        return isinstance(extra, dict) and bool(extra.get(CAPTURE_SCHEDULE_KEY))

    def _depth_rule(self) -> DepthRule:
        """The engine's batch-depth rule, from the platform and the resolved config."""
        from vllm.platforms import current_platform

        lookup = self.dynamic_sd_lookup or []
        config: Any = self.vllm_config  # type: ignore[attr-defined]
        return rule_for(config, current_platform.device_type, set(lookup[1:]))

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        """vLLM's update, then the step's period for the cost model (`engine.vllm.step_clock`)."""
        outputs: dict[int, EngineCoreOutputs] = super().update_from_output(  # type: ignore[misc]
            scheduler_output, model_runner_output
        )
        busy = self.get_num_unfinished_requests() > 0  # type: ignore[attr-defined]
        elapsed_ms = self._step_clock.stamp(scheduler_output, outputs, busy)
        budget = self.specgw_verify_budget
        if budget is not None:
            if elapsed_ms is not None:
                budget.costs.observe(
                    len(scheduler_output.num_scheduled_tokens),
                    scheduler_output.total_num_scheduled_tokens,
                    elapsed_ms,
                )
            budget.graded(_verified(scheduler_output, model_runner_output))
        return outputs

    def _trim_to_budget(self, req_ids: list[str]) -> None:
        """Cut the drafts just taken to what the verify budget admits (module docstring)."""
        budget = self.specgw_verify_budget
        if budget is None:
            return
        drafting: list[Request] = []
        for req_id in req_ids:
            request = self.requests.get(req_id)
            if request is not None and request.spec_token_ids and not request.is_finished():
                drafting.append(request)
        if not drafting:
            return
        drafts = [Draft(r.request_id, _class_key(r), len(r.spec_token_ids)) for r in drafting]
        running = len(self.running)  # type: ignore[attr-defined]
        for request, admitted in zip(drafting, budget.trim(drafts, running), strict=True):
            if admitted < len(request.spec_token_ids):
                request.spec_token_ids = list(request.spec_token_ids[:admitted])

    def add_request(self, request: Request) -> None:
        new = request.request_id not in self.requests
        if self.num_spec_tokens > 0 and new:
            self._take_step_args(request)
            cap = requested_cap(request, self.num_spec_tokens)
            if cap is not None:
                self._cap_in_flight(cap)
            if self._depth(request) == 0 or self._rides(request):
                _salt_depth_zero(request)
        super().add_request(request)  # type: ignore[misc]

    #: Requests lowered by a newcomer's cap since the scheduler started (for tests, logs).
    specgw_capped: int = 0

    def _cap_in_flight(self, cap: int) -> None:
        """Lower every unfinished request deeper than `cap` to `cap`, drafts included.

        One that has not been scheduled yet and comes down to 0 moves to the k = 0
        prefix-cache namespace, as if it had asked for 0 (`_salt_depth_zero`); one
        already running keeps the namespace its blocks were filled in, so blocks of
        its later output, filled in steps that skipped the drafter, may be reused by
        a k > 0 request that then drafts from stale drafter KV there: lower
        acceptance for that stretch, never a different output (the target verifies).
        """
        for request in self.requests.values():
            if request.is_finished() or self._depth(request) <= cap:
                continue
            self._lower(request, cap)
            self.specgw_capped += 1

    def _lower(self, request: Request, depth: int) -> None:
        """Lower one request to `depth` for the rest of its life, drafts included (a cap,
        a voter's retirement, a rider's drop): at 0 before its first step it moves to the
        k = 0 namespace, where a rider is from admission."""
        request._specgw_k = depth  # type: ignore[attr-defined]
        if depth == 0 and request.num_computed_tokens == 0 and not self._rides(request):
            _salt_depth_zero(request)
        if len(request.spec_token_ids) > depth:
            request.spec_token_ids = list(request.spec_token_ids[:depth])

    def _depth_zero_hits_whole_blocks(self) -> None:
        """Look up a k = 0 request's cache hit without vLLM's EAGLE last-block drop.

        The drop exists because the drafter's KV at a hit's last position was made
        with the token after it, which another prompt may not share; a k = 0 request
        (salted apart, `_salt_depth_zero`) never runs the drafter, so its hit can run
        to the last full block, as on an engine without a drafter. Only for vLLM's
        single-group coordinator, which reads the EAGLE groups per lookup (vLLM 0.32:
        `eagle_group_ids`; 0.33: `drop_eagle_group_ids`); other layouts keep the drop
        (their requests are still salted apart).
        """
        manager: Any = getattr(self, "kv_cache_manager", None)
        coordinator: Any = getattr(manager, "coordinator", None)
        if (
            self.num_spec_tokens == 0
            or coordinator is None
            or type(coordinator).__name__ != "UnitaryKVCacheCoordinator"
        ):
            return
        attr = "drop_eagle_group_ids" if hasattr(coordinator, "drop_eagle_group_ids") else None
        attr = attr or "eagle_group_ids"
        if not getattr(coordinator, attr, None):
            return
        lookup = manager.get_computed_blocks
        eagle_groups = getattr(coordinator, attr)

        def get_computed_blocks(request: Request, *args: Any, **kwargs: Any) -> Any:
            if self._depth(request) != 0:
                return lookup(request, *args, **kwargs)
            setattr(coordinator, attr, set())
            try:
                return lookup(request, *args, **kwargs)
            finally:
                setattr(coordinator, attr, eagle_groups)

        manager.get_computed_blocks = get_computed_blocks

    def _depth(self, request: Request) -> int:
        # Cached on the request: extra_args never changes after admission; a newcomer's
        # cap lowers the cached value (`_cap_in_flight`).
        cached: int | None = getattr(request, "_specgw_k", None)
        if cached is None:
            cached = requested_depth(request, self.num_spec_tokens)
            request._specgw_k = cached  # type: ignore[attr-defined]
        return cached

    def _plan_step(self, scheduler_output: SchedulerOutput) -> None:
        """Set the step's draft depth from its requests' k (`engine.vllm.batch_depth`)."""
        if self.num_spec_tokens <= 0 or not scheduler_output.num_scheduled_tokens:
            return
        scheduled = [
            request
            for req_id in scheduler_output.num_scheduled_tokens
            if (request := self.requests.get(req_id)) is not None
        ]
        rule = self.specgw_depth_rule
        # Before this step's update: a request still prefilling has prompt tokens left.
        prefilling = [r.num_computed_tokens < r.num_prompt_tokens for r in scheduled]
        self._voted = self._vote_depth(scheduled, any(prefilling))
        wanted = [self._step_k(request) for request in scheduled]
        depth = min(scheduler_output.num_spec_tokens_to_schedule, rule.step_depth(wanted))
        if all(prefilling):
            depth = rule.first_step_depth(depth)
        elif any(prefilling):
            depth = rule.prefill_step_depth(depth)
        if self._voted == 0 and depth == 0 and rule.zero_skips_drafter:
            # Voters may run deeper in a later step, from drafter KV that a depth-0 step
            # would skip (`engine.vllm.draft_skip`): draft once, verify none.
            depth = 1
        scheduler_output.num_spec_tokens_to_schedule = depth
        # No request of the step drafts in it or later (a depth only goes down; a rider
        # drafts only beside voters): Model Runner V2 may skip the drafter's KV pass
        # (`engine.vllm.draft_skip`).
        idle = not any(self._drafts_later(r) for r in scheduled)
        setattr(scheduler_output, DRAFTER_IDLE, idle)
        if depth == 0 and (idle or rule.zero_skips_drafter):
            self._drop_riders(scheduled)
        self._specgw_step = depth
        if rule.is_mixed(wanted):
            self.specgw_mixed_steps += 1

    def _cap_drafts(self, request: Request) -> None:
        """Cut a request's drafts (or placeholders) to what the rule gives it this step."""
        allowed = self.specgw_depth_rule.drafts_for(self._step_k(request), self._specgw_step)
        if len(request.spec_token_ids) > allowed:
            request.spec_token_ids = list(request.spec_token_ids[:allowed])


class SpecDepthScheduler(_DepthCap, Scheduler):
    """The synchronous scheduler with per-request draft caps."""

    #: Drafts asked for in the step just scheduled (-1: no step, or not capped).
    specgw_step_depth: int = -1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _skip_draft_pickup_in_depth_zero_steps()

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        self.specgw_step_depth = -1
        if self.num_spec_tokens > 0 and scheduler_output.num_scheduled_tokens:
            self._plan_step(scheduler_output)
            self.specgw_step_depth = scheduler_output.num_spec_tokens_to_schedule
        super()._update_after_schedule(scheduler_output)

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        super().update_draft_token_ids(draft_token_ids)
        for req_id in draft_token_ids.req_ids:
            request = self.requests.get(req_id)
            if request is not None and request.spec_token_ids:
                self._cap_drafts(request)
        self._trim_to_budget(draft_token_ids.req_ids)


class AsyncSpecDepthScheduler(_DepthCap, AsyncScheduler):
    """The async scheduler with per-request caps on its placeholder drafts."""

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        self._plan_step(scheduler_output)
        super()._update_after_schedule(scheduler_output)
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is not None and request.spec_token_ids:
                self._cap_drafts(request)

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        # Used by async engines when the runner hands drafts back out of band.
        super().update_draft_token_ids(draft_token_ids)
        for req_id in draft_token_ids.req_ids:
            request = self.requests.get(req_id)
            if request is not None and request.spec_token_ids:
                self._cap_drafts(request)


def _class_key(request: Request) -> object:
    """The request's class id (`SPEC_CLASS_ARG`; None: unclassified, one estimator)."""
    params = request.sampling_params
    extra = params.extra_args if params is not None else None
    value = extra.get(SPEC_CLASS_ARG) if extra else None
    return value if isinstance(value, str) else None


def _verified(
    scheduler_output: SchedulerOutput, output: ModelRunnerOutput
) -> dict[str, tuple[int, int]]:
    """Per request of the step: (drafts verified, drafts accepted): its sampled tokens
    less the bonus token, as vLLM's own update counts them."""
    index = output.req_id_to_index
    sampled = output.sampled_token_ids
    out = {}
    for req_id, spec in scheduler_output.scheduled_spec_decode_tokens.items():
        i = index.get(req_id)
        if i is None or i >= len(sampled) or not spec:
            continue
        out[req_id] = (len(spec), max(0, min(len(spec), len(sampled[i]) - 1)))
    return out


def _worker_confidences(executor: Any, budget: ConfidenceBudget) -> dict[str, list[float]]:
    """The workers' log-odds of each request's last drafts (`engine.vllm.draft_confidence`),
    its hook installed on first use (keeping no graded records: the scheduler grades)."""
    if budget.hooked is None:
        installed = executor.collective_rpc("specgw_install_draft_confidence", args=(False,))
        budget.hooked = bool(installed) and all(installed)
        if not budget.hooked:
            log.warning("verify budget: the runner gives no draft confidences; drafts kept")
    if not budget.hooked:
        return {}
    found: dict[str, list[float]] = executor.collective_rpc("specgw_draft_confidences")[0]
    return found


def _salt_depth_zero(request: Request) -> None:
    """Rehash a k = 0 request's blocks under `DEPTH_ZERO_SALT` (its own prefix-cache namespace).

    vLLM hashes a request's full blocks when the engine core builds it, with its
    `cache_salt` in the first block's key; the scheduler sees it before any lookup,
    so the hashes are redone here. A client's own salt is kept in front.
    """
    if getattr(request, "_block_hasher", None) is None:
        return  # prefix caching off: no hashes to keep apart
    request.cache_salt = (
        f"{request.cache_salt}|{DEPTH_ZERO_SALT}" if request.cache_salt else DEPTH_ZERO_SALT
    )
    request.block_hashes = []
    request.update_block_hashes()


def _skip_draft_pickup_in_depth_zero_steps() -> None:
    """After a step in which no request wanted drafts, do not fetch drafts from the worker.

    vLLM's synchronous engine core asks the worker for the step's drafts after every
    step (`EngineCore.post_step` -> `take_draft_token_ids`): one more round trip to
    the worker process per step, on a CPU with few cores a measurable share of a
    small model's step. In a depth-0 step (every request k = 0) there is nothing to fetch
    that would be kept: each request's drafts are capped to none. Patched once per
    engine-core process, on the class, since the scheduler never sees its engine core.
    """
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore.post_step, "_specgw", False):
        return
    post_step = EngineCore.post_step

    def post_step_unless_depth_zero(self: Any, model_executed: bool) -> None:
        if getattr(self.scheduler, "specgw_step_depth", -1) == 0:
            return
        budget = getattr(self.scheduler, "specgw_verify_budget", None)
        if budget is not None and model_executed:
            # Before the pickup: `update_draft_token_ids` trims from them.
            budget.confidences = _worker_confidences(self.model_executor, budget)
        post_step(self, model_executed)

    post_step_unless_depth_zero._specgw = True  # type: ignore[attr-defined]
    # `engine.vllm.compat` checks vLLM's own method behind the patch.
    post_step_unless_depth_zero.__wrapped__ = post_step  # type: ignore[attr-defined]
    EngineCore.post_step = post_step_unless_depth_zero  # type: ignore[method-assign]


def scheduler_class(async_scheduling: bool) -> type[Any]:
    """The class to pass as `scheduler_cls` for the engine's scheduling mode."""
    return AsyncSpecDepthScheduler if async_scheduling else SpecDepthScheduler


class AutoSpecDepthScheduler:
    """`scheduler_cls` when vLLM picks the scheduling mode: the flavour the config resolved to.

    With `async_scheduling=None` vLLM decides only while building its config (CUDA:
    on for EAGLE; CPU: forced off), after the engine arguments name the class. A
    sync scheduler under async execution would not book placeholder drafts, so the
    class is chosen here, from the resolved `scheduler_config.async_scheduling`.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        vllm_config = kwargs["vllm_config"] if "vllm_config" in kwargs else args[0]
        chosen = scheduler_class(bool(vllm_config.scheduler_config.async_scheduling))
        return chosen(*args, **kwargs)


__all__ = [
    "DEPTH_ZERO_SALT",
    "AsyncSpecDepthScheduler",
    "AutoSpecDepthScheduler",
    "SpecDepthScheduler",
    "requested_depth",
    "scheduler_class",
]
