"""Skip the drafter entirely in steps where every request has k = 0.

vLLM's dynamic-SD path with `num_spec_tokens_to_schedule = 0` still runs the
drafter's first forward pass (to keep the drafter's KV cache in step with the
target), and on a small target that pass plus its bookkeeping is most of the
k = 0 overhead. Here it is not needed: a request's k is fixed for its life, so
a k = 0 request never reads its drafter KV, and a request with k > 0 lifts the
step depth above 0 in every step it is in (`engine.scheduler`), so the drafter
runs in all of its steps and its drafter KV stays complete.

Mechanism: vLLM's `worker_extension_cls` mixes this class into the worker;
`VLLMEngine` calls `specgw_install_draft_skip` once through `collective_rpc`.
It wraps the model runner's `execute_model` to note the step depth and its
`_input_fits_in_drafter` check to say "no" when the depth is 0, which sends
the runner down its own "drafter skipped" path (zero drafts, which the
scheduler then caps to nothing). That check is private to vLLM 0.32's v1
model runner: when it is absent the install returns False and nothing changes.
"""

from __future__ import annotations

from typing import Any


class DraftSkipExtension:
    """Worker extension (mixed into vLLM's worker class by `worker_extension_cls`)."""

    def specgw_install_draft_skip(self) -> bool:
        runner: Any = getattr(self, "model_runner", None)
        if (
            runner is None
            or getattr(runner, "speculative_config", None) is None
            or not hasattr(runner, "_input_fits_in_drafter")
            or getattr(runner, "_specgw_draft_skip", False)
        ):
            return False
        execute_model = runner.execute_model
        fits_in_drafter = runner._input_fits_in_drafter
        step = {"depth": -1, "skipped": 0}

        def execute_with_depth(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
            step["depth"] = int(getattr(scheduler_output, "num_spec_tokens_to_schedule", -1))
            return execute_model(scheduler_output, *args, **kwargs)

        def fits_unless_depth_zero(common_attn_metadata: Any) -> bool:
            if step["depth"] == 0:
                step["skipped"] += 1
                return False
            return bool(fits_in_drafter(common_attn_metadata))

        runner.execute_model = execute_with_depth
        runner._input_fits_in_drafter = fits_unless_depth_zero
        runner._specgw_draft_skip = step
        return True

    def specgw_draft_skips(self) -> int:
        """Steps in which the drafter was skipped so far (tests read this)."""
        step = getattr(getattr(self, "model_runner", None), "_specgw_draft_skip", None)
        return int(step["skipped"]) if isinstance(step, dict) else 0
