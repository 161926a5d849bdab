"""Skip the drafter entirely in steps where every request has k = 0.

vLLM's dynamic-SD path with `num_spec_tokens_to_schedule = 0` still runs the
drafter's first forward pass (to keep the drafter's KV cache in step with the
target), and on a small target that pass plus its bookkeeping is most of the
k = 0 overhead. Here it is not needed: a request's k is fixed for its life, so
a k = 0 request never reads its drafter KV, and a request with k > 0 lifts the
step depth above 0 in every step it is in (`engine.vllm.scheduler`), so the drafter
runs in all of its steps and its drafter KV stays complete.

Skipping the drafter is not all: vLLM 0.32 sends every step of a speculative
runner down its speculative path even when no request has a draft (spec-decode
metadata, the rejection sampler, draft bookkeeping, a slot mapping per KV
group). Under the synchronous scheduler (CPU), a depth-0 step therefore runs
with the runner's speculative config hidden, i.e. exactly as a runner without
speculation runs it; and the engine core does not fetch the step's (absent)
drafts from the worker afterwards (`engine.vllm.scheduler`). Together these took the
TPOT of k = 0 requests from 1.11x to 0.97x that of a no-drafter engine at
concurrency 1 (`python -m bench.floor_interleaved --depths 0`).

Mechanism: vLLM's `worker_extension_cls` mixes this class into the worker (as part of
`engine.vllm.worker.SpecGatewayWorker`);
`VLLMEngine` calls `specgw_install_draft_skip` once through `collective_rpc`.
It wraps the model runner's `execute_model` and `sample_tokens` to note the step
depth and run depth-0 steps plainly (synchronous scheduling only: with async
scheduling a step's work overlaps the next one's), and its
`_input_fits_in_drafter` check to say "no" when the depth is 0 (the async case),
which sends the runner down its own "drafter skipped" path (zero drafts, which
the scheduler then caps to nothing). These are private to the V1 model runner
(`vllm/v1/worker/gpu_model_runner.py`, vLLM 0.32 and 0.33, which the CPU runner
subclasses): when one is absent or takes other parameters (`RUNNER_HOOKS`) the
install returns False and nothing changes.

Model Runner V2 (vLLM 0.33's CUDA default, `vllm/v1/worker/gpu/model_runner.py`)
has no such check: its `sample_tokens` calls the speculator's `propose` in every step,
which runs the drafter's KV pass over the step's tokens and then drafts
`num_speculative_tokens` for the whole batch (`TargetDependentARSpeculator.propose`;
at 0 it fills its draft buffer with -1 and returns it). vLLM keeps that pass in steps
whose drafts go unused (its own `skip_drafts`: a prompt chunk still needs its drafter
KV), and the gateway keeps it in a step the step rule holds at depth 0 (its voters may
draft later). Only where no request of the step drafts in it or later, which the
scheduler marks on the step (`DRAFTER_IDLE`), does this install's `propose` return
that same -1 buffer without running the drafter: the k = 0 cost vLLM issue 49986
measures (+6.6 %). The step keeps its spec-decode bookkeeping and the target's aux
hidden-state capture (inside its CUDA graph). Only with one data-parallel rank, one
pipeline stage, no prefill context parallelism and no adaptive verification
(`v2_skip_allowed`): `propose` synchronises DP ranks, and adaptive verification reads
each proposal's confidences.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

#: Runner methods the skip wraps, and the parameters the wrappers pass on.
RUNNER_HOOKS: dict[str, tuple[str, ...]] = {
    "_input_fits_in_drafter": ("common_attn_metadata",),
    "execute_model": ("scheduler_output",),
    "sample_tokens": ("grammar_output",),
}


#: `SchedulerOutput` attribute the gateway's scheduler sets on each step: no request
#: of the step drafts in it or later (a plain dataclass: it travels to the workers).
DRAFTER_IDLE = "specgw_drafter_idle"
#: Model Runner V2: the runner method the skip wraps (and the parameter it reads), and
#: the speculator's `propose` parameters it reads.
V2_RUNNER_HOOKS: dict[str, tuple[str, ...]] = {"execute_model": ("scheduler_output",)}
V2_PROPOSE_PARAMS: tuple[str, ...] = ("input_batch", "dummy_run", "num_speculative_tokens")


def v2_skip_allowed(vllm_config: Any) -> bool:
    """Whether a resolved config lets Model Runner V2 skip its drafter in an idle step
    (the module's docstring; duck-typed on vLLM's `VllmConfig`)."""
    parallel = getattr(vllm_config, "parallel_config", None)
    spec = getattr(vllm_config, "speculative_config", None)
    return (
        int(getattr(parallel, "data_parallel_size", 1)) == 1
        and int(getattr(parallel, "pipeline_parallel_size", 1)) == 1
        and int(getattr(parallel, "prefill_context_parallel_size", 1)) == 1
        and not getattr(spec, "enable_adaptive_verification", False)
    )


def v2_runner_supports_skip(runner: Any) -> bool:
    """Whether `runner` is a Model Runner V2 whose drafter the skip can wrap."""
    speculator = getattr(runner, "speculator", None)
    if speculator is None or getattr(speculator, "draft_tokens", None) is None:
        return False
    if getattr(runner, "pcp_manager", None) is not None:
        return False
    if getattr(runner, "adaptive_verification", None) is not None:
        return False
    if not v2_skip_allowed(getattr(runner, "vllm_config", None)):
        return False
    if not _takes(runner, V2_RUNNER_HOOKS):
        return False
    try:
        params = list(inspect.signature(speculator.propose).parameters)
    except (AttributeError, TypeError, ValueError):
        return False
    return params[:1] == ["input_batch"] and set(V2_PROPOSE_PARAMS) <= set(params)


def _takes(runner: Any, hooks: dict[str, tuple[str, ...]]) -> bool:
    """Whether `runner` has each hooked method, its parameters starting as expected."""
    for name, params in hooks.items():
        method = getattr(runner, name, None)
        if method is None:
            return False
        try:
            names = list(inspect.signature(method).parameters)
        except (TypeError, ValueError):
            return False
        if tuple(names[: len(params)]) != params:
            return False
    return True


def runner_supports_skip(runner: Any) -> bool:
    """Whether `runner` (the V1 runner) has every hooked method with the parameters the
    wrappers expect."""
    return _takes(runner, RUNNER_HOOKS)


def _plain_step(runner: Any, spec_config: Any, aux: Any) -> Callable[..., Any]:
    """A call runner for depth-0 steps (see `plain`): the runner without speculation."""

    def plain(call: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one call of a depth-0 step as a runner without speculation.

        vLLM 0.32 sends every step of a speculative runner down its speculative
        path (spec-decode metadata, the rejection sampler, draft bookkeeping) even
        when no request has a draft; with the config hidden for the step the runner
        takes its plain path, which is what a depth-0 step is. The target's EAGLE-3
        aux hidden states (a sum per captured layer, read only by the drafter) are
        not taken either, where the model runs eagerly (`_aux_capture`).
        """
        runner.speculative_config = None
        if aux is not None:
            runner.use_aux_hidden_state_outputs = False
            aux[0].aux_hidden_state_layers = ()
        try:
            return call(*args, **kwargs)
        finally:
            runner.speculative_config = spec_config
            if aux is not None:
                runner.use_aux_hidden_state_outputs = True
                aux[0].aux_hidden_state_layers = aux[1]

    return plain


class DraftSkipExtension:
    """Worker extension (mixed into vLLM's worker class by `worker_extension_cls`)."""

    def specgw_install_draft_skip(self) -> bool:
        runner: Any = getattr(self, "model_runner", None)
        if (
            runner is None
            or getattr(runner, "speculative_config", None) is None
            or getattr(runner, "_specgw_draft_skip", False)
        ):
            return False
        if runner_supports_skip(runner):
            return _install_v1(runner)
        if v2_runner_supports_skip(runner):
            return _install_v2(runner)
        return False

    def specgw_draft_skips(self) -> int:
        """Steps in which the drafter was skipped so far (tests read this)."""
        step = getattr(getattr(self, "model_runner", None), "_specgw_draft_skip", None)
        return int(step["skipped"]) if isinstance(step, dict) else 0


def _install_v1(runner: Any) -> bool:
    """The V1 runner's skip (the module's docstring)."""
    execute_model = runner.execute_model
    sample_tokens = runner.sample_tokens
    fits_in_drafter = runner._input_fits_in_drafter
    step = {"depth": -1, "skipped": 0}
    # Synchronous scheduling only: there each step's execute_model and sample_tokens
    # run back to back, with nothing of the step left in flight for the next one.
    plain_steps = not getattr(runner, "use_async_scheduling", True)
    spec_config = runner.speculative_config
    aux = _aux_capture(runner)

    plain = _plain_step(runner, spec_config, aux)

    def execute_with_depth(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        step["depth"] = int(getattr(scheduler_output, "num_spec_tokens_to_schedule", -1))
        if plain_steps and step["depth"] == 0:
            step["skipped"] += 1  # the drafter does not run in a plain step
            return plain(execute_model, scheduler_output, *args, **kwargs)
        return execute_model(scheduler_output, *args, **kwargs)

    def sample_with_depth(*args: Any, **kwargs: Any) -> Any:
        if plain_steps and step["depth"] == 0:
            return plain(sample_tokens, *args, **kwargs)
        return sample_tokens(*args, **kwargs)

    def fits_unless_depth_zero(common_attn_metadata: Any) -> bool:
        if step["depth"] == 0:
            step["skipped"] += 1
            return False
        return bool(fits_in_drafter(common_attn_metadata))

    runner.execute_model = execute_with_depth
    runner.sample_tokens = sample_with_depth
    runner._input_fits_in_drafter = fits_unless_depth_zero
    runner._specgw_draft_skip = step
    return True


def _install_v2(runner: Any) -> bool:
    """Model Runner V2's skip (the module's docstring): `propose` in a step marked
    `DRAFTER_IDLE` returns what it returns for zero drafts, without running the drafter."""
    execute_model = runner.execute_model
    speculator = runner.speculator
    propose = speculator.propose
    step = {"idle": False, "skipped": 0}

    def execute_noting_idle(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        # `sample_tokens` (which proposes) follows its step's `execute_model` before the
        # next one: V2 hands the step over in one `execute_model_state`.
        idle = getattr(scheduler_output, DRAFTER_IDLE, False) is True
        step["idle"] = idle and not kwargs.get("dummy_run", False)
        return execute_model(scheduler_output, *args, **kwargs)

    def propose_unless_idle(input_batch: Any, *args: Any, **kwargs: Any) -> Any:
        if not step["idle"] or kwargs.get("dummy_run", False):
            return propose(input_batch, *args, **kwargs)
        step["skipped"] += 1
        drafts = speculator.draft_tokens[: input_batch.num_reqs]
        drafts.fill_(-1)  # as `propose` itself returns zero drafts
        return drafts

    runner.execute_model = execute_noting_idle
    speculator.propose = propose_unless_idle
    runner._specgw_draft_skip = step
    return True


def _aux_capture(runner: Any) -> tuple[Any, tuple[int, ...]] | None:
    """(the model holding the EAGLE-3 aux layers, those layers), where a plain step may
    turn the capture off; None where it may not.

    The target adds up `hidden_states + residual` at each aux layer in every step
    (`EagleModelMixin._maybe_add_hidden_state`) and returns them beside its hidden
    states when the list is not empty (`LlamaModel.forward`); the runner unpacks the
    pair only while `use_aux_hidden_state_outputs` (`execute_model`). A step that runs
    no drafter needs none of it. Only for an eager model: a compiled one has the layer
    set traced into its graph, and changing it per step would recompile.
    """
    if not getattr(runner, "use_aux_hidden_state_outputs", False):
        return None
    model_config = getattr(runner, "model_config", None)
    if not getattr(model_config, "enforce_eager", False):
        return None
    model = getattr(runner, "model", None)
    holder = getattr(model, "model", model)
    layers = getattr(holder, "aux_hidden_state_layers", None)
    if not layers or not isinstance(layers, tuple):
        return None
    return holder, layers
