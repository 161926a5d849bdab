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
concurrency 1 (`python -m bench.k0_overhead --depths 0 --repeat 2`, see the README).

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
has no such check: its drafter runs its KV pass in every step and drafts
`num_spec_tokens_to_schedule` (0 in a depth-0 step) for the whole batch
(`TargetDependentARSpeculator.propose`). There the install returns False: k = 0
steps cost the drafter's KV pass, and `VLLMEngine.draft_skip` says so.
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


def runner_supports_skip(runner: Any) -> bool:
    """Whether `runner` has every hooked method with the parameters the wrappers expect."""
    for name, params in RUNNER_HOOKS.items():
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
            or not runner_supports_skip(runner)
            or getattr(runner, "_specgw_draft_skip", False)
        ):
            return False
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

    def specgw_draft_skips(self) -> int:
        """Steps in which the drafter was skipped so far (tests read this)."""
        step = getattr(getattr(self, "model_runner", None), "_specgw_draft_skip", None)
        return int(step["skipped"]) if isinstance(step, dict) else 0


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
