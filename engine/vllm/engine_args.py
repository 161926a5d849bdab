"""vLLM engine arguments for the gateway's engine settings (the one place that builds them).

The drafter at K (`num_speculative_tokens`), the scheduler class that caps each
request's drafts (`engine.vllm.scheduler`), the worker extension, per-request
spec-decode metrics, and the settings' overrides (`extra_args` last).
"""

from __future__ import annotations

from typing import Any

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.platforms import current_platform

from engine.settings import EngineSettings
from engine.vllm.batch_depth import PREFILL_STEP_KEY

#: Default block size where vLLM's is too coarse for EAGLE's prefix-cache rule:
#: a hit recomputes its last matched block, 128 tokens on vLLM's CPU platform.
#: Embedded model, a repeated ~920-token prompt at k = 4: 252 ms to the first token
#: with 128-token blocks, 103 ms with 32 (`python -m bench.prefix_cache`); same decode time.
_CPU_BLOCK_SIZE = {"cpu": 32}


def eager_for(settings: EngineSettings, device_type: str) -> bool:
    """`enforce_eager` resolved: the setting, else graphs on CUDA and eager elsewhere.

    On CUDA, eager mode turns off torch.compile and CUDA graphs, and with them the
    uniform-depth rule and Model Runner V2's drafter skip (`engine.vllm.batch_depth`);
    on the CPU, vLLM's compilation adds minutes to a start for no measured gain here.
    """
    if settings.enforce_eager is not None:
        return settings.enforce_eager
    return device_type != "cuda"


def engine_args(settings: EngineSettings) -> AsyncEngineArgs:
    """vLLM engine arguments for these settings (K from the drafter's presence)."""
    target, drafter = settings.resolved_models()
    speculative: dict[str, Any] | None = None
    if drafter is not None and settings.max_depth > 0:
        speculative = {
            "method": "eagle3",
            "model": str(drafter),
            "num_speculative_tokens": settings.max_depth,
        }
        if settings.spec_tokens_per_batch_size:
            speculative["num_speculative_tokens_per_batch_size"] = [
                list(row) for row in settings.spec_tokens_per_batch_size
            ]
    # (class, async_scheduling): `auto` leaves the mode to vLLM and the class follows it.
    scheduler, async_scheduling = {
        "sync": ("SpecDepthScheduler", False),
        "async": ("AsyncSpecDepthScheduler", True),
        "auto": ("AutoSpecDepthScheduler", None),
    }[settings.scheduler]
    device = current_platform.device_type
    kwargs: dict[str, Any] = dict(
        model=str(target),
        served_model_name=settings.served_names(),
        speculative_config=speculative,
        scheduler_cls=f"engine.vllm.scheduler.{scheduler}",
        async_scheduling=async_scheduling,
        per_request_spec_decode_metrics=settings.per_request_metrics if speculative else "none",
        dtype=settings.dtype,
        max_num_seqs=settings.resolved_max_num_seqs(),
        enforce_eager=eager_for(settings, device),
        seed=settings.seed,
        disable_log_stats=False,
        worker_extension_cls="engine.vllm.worker.SpecGatewayWorker",
    )
    if settings.max_model_len is not None:  # else vLLM's: the model's own length
        kwargs["max_model_len"] = settings.max_model_len
    block_size = settings.block_size or _CPU_BLOCK_SIZE.get(device)
    if block_size is not None:
        kwargs["block_size"] = block_size
    if settings.tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = settings.tensor_parallel_size
    if settings.gpu_memory_utilization != 0.9:
        kwargs["gpu_memory_utilization"] = settings.gpu_memory_utilization
    kwargs.update(settings.extra_args)
    if settings.prefill_step_depth is not None:
        # Beside, not under, an `additional_config` in `extra_args` (its own key wins).
        extra = dict(kwargs.get("additional_config") or {})
        extra.setdefault(PREFILL_STEP_KEY, settings.prefill_step_depth)
        kwargs["additional_config"] = extra
    return AsyncEngineArgs(**kwargs)
