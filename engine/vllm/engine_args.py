"""vLLM engine arguments for the gateway's engine settings (the one place that builds them).

The drafter at K (`num_speculative_tokens`), the scheduler class that caps each
request's drafts (`engine.vllm.scheduler`), the worker extension, per-request
spec-decode metrics, and the settings' overrides (`extra_args` last).
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.platforms import current_platform

from engine.settings import EngineSettings
from engine.vllm.batch_depth import (
    CAPTURE_SCHEDULE_KEY,
    PREFILL_STEP_KEY,
    capture_schedule,
    capture_sizes,
)
from engine.vllm.confidence_budget import VERIFY_BUDGET_KEY

log = logging.getLogger("specgw")

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


def capture_ceiling() -> int:
    """vLLM's default ceiling on a CUDA graph's tokens (`VllmConfig._set_cudagraph_sizes`):
    1024 on data-centre Blackwell (capability family 100), else 512."""
    return 1024 if current_platform.is_device_capability_family(100) else 512


def graph_capture(settings: EngineSettings, ceiling: int, device: str) -> dict[str, Any]:
    """The speculative and compilation entries that capture every width 1 + k.

    Only where the operator set no batch-size schedule of their own: theirs is also a
    per-batch-size ceiling on k, which they asked for; the gateway's is for capture only
    (`CAPTURE_SCHEDULE_KEY`: the depth cap reads K from it at every batch size).
    """
    k_max, seqs = settings.max_depth, settings.resolved_max_num_seqs(device)
    return {
        "schedule": capture_schedule(k_max, seqs),
        "compilation_config": {"cudagraph_capture_sizes": capture_sizes(k_max, seqs, ceiling)},
    }


def engine_args(
    settings: EngineSettings, device: str | None = None, *, capture: bool = True
) -> AsyncEngineArgs:
    """vLLM engine arguments for these settings (K from the drafter's presence).

    `device`: the platform to decide for (`cuda`, `cpu`); None = the one vLLM resolved
    here. The start-up plan (`engine.vllm.plan`) decides for CUDA on a machine without.
    `capture`: add the capture schedule where graphs run (`graph_capture`).
    """
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
    device = device or current_platform.device_type
    kwargs: dict[str, Any] = dict(
        model=str(target),
        served_model_name=settings.served_names(),
        speculative_config=speculative,
        scheduler_cls=f"engine.vllm.scheduler.{scheduler}",
        async_scheduling=async_scheduling,
        per_request_spec_decode_metrics=settings.per_request_metrics if speculative else "none",
        dtype=settings.dtype,
        max_num_seqs=settings.resolved_max_num_seqs(device),
        enforce_eager=eager_for(settings, device),
        seed=settings.seed,
        disable_log_stats=False,
        worker_extension_cls="engine.vllm.worker.SpecGatewayWorker",
    )
    if settings.max_model_len is not None:  # else vLLM's: the model's own length
        kwargs["max_model_len"] = settings.max_model_len
    eager = kwargs["enforce_eager"]
    if device == "cuda" and not eager:
        # Each step's graph mode, for the FULL-graph share (`specgw_engine_cudagraph_steps`).
        kwargs["cudagraph_metrics"] = True
    extra_config: dict[str, Any] = {}
    own_schedule = bool(settings.spec_tokens_per_batch_size)
    if capture and speculative and device == "cuda" and not eager and not own_schedule:
        graphs = graph_capture(settings, capture_ceiling(), device)
        speculative["num_speculative_tokens_per_batch_size"] = graphs["schedule"]
        kwargs["compilation_config"] = graphs["compilation_config"]
        extra_config[CAPTURE_SCHEDULE_KEY] = True
    block_size = settings.block_size or _CPU_BLOCK_SIZE.get(device)
    if block_size is not None:
        kwargs["block_size"] = block_size
    if settings.tensor_parallel_size > 1:
        kwargs["tensor_parallel_size"] = settings.tensor_parallel_size
    if settings.gpu_memory_utilization != 0.9:
        kwargs["gpu_memory_utilization"] = settings.gpu_memory_utilization
    kwargs.update(settings.extra_args)
    if settings.prefill_step_depth is not None:
        extra_config[PREFILL_STEP_KEY] = settings.prefill_step_depth
    _verify_budget(settings, kwargs, extra_config, device)
    if extra_config:
        # Beside, not under, an `additional_config` in `extra_args` (its own keys win).
        kwargs["additional_config"] = extra_config | dict(kwargs.get("additional_config") or {})
    return AsyncEngineArgs(**kwargs)


def _verify_budget(
    settings: EngineSettings, kwargs: dict[str, Any], extra_config: dict[str, Any], device: str
) -> None:
    """The verify budget (`EngineSettings.verify_budget`) where the engine speculates.

    The CPU's synchronous scheduler runs the rule itself (`engine.vllm.confidence_budget`,
    turned on by `VERIFY_BUDGET_KEY`); on CUDA vLLM 0.33's adaptive verification runs it in
    Model Runner V2, turned on in the speculative config, and the worker hook that
    `VERIFY_BUDGET_KEY` turns on brings each request's class bound and its class's estimator
    to it (`engine.vllm.class_verification`). Either way the gateway's drafter
    skip at depth 0 stands down on CUDA (`draft_skip.v2_skip_allowed`: adaptive verification
    reads every proposal's confidences), which is said once here, not left to be found.
    """
    spec = kwargs.get("speculative_config")
    if not isinstance(spec, dict):
        return
    if settings.verify_budget != "off":
        extra_config[VERIFY_BUDGET_KEY] = settings.verify_budget
        if device == "cuda":
            spec.setdefault("enable_adaptive_verification", True)
    if device == "cuda" and spec.get("enable_adaptive_verification"):
        # The bounds reach vLLM's budget through the worker hook, which the verify-budget
        # setting turns on (`engine.vllm.class_verification`); without it, only as the
        # step's depth (the batch-depth rule gives every drafting request the step's).
        steered = settings.verify_budget != "off"
        log.warning(
            "adaptive verification on: the drafter runs in every step, the skip at depth 0 "
            "stands down (%s)",
            "each request's class bound caps its verified drafts"
            if steered
            else "class bounds reach it as the step's depth only: verify_budget=on steers it",
        )


def checked_engine_args(settings: EngineSettings) -> AsyncEngineArgs:
    """`engine_args`, without the capture schedule where vLLM falls back to the V1 runner.

    The V1 runner captures no width but 1 + K, and turns FULL graphs off altogether
    under any batch-size schedule (`VllmConfig._maybe_override_dynamic_sd_cudagraph_mode`),
    so there the schedule would cost the graphs it is there to add.
    """
    args = engine_args(settings)
    if CAPTURE_SCHEDULE_KEY not in (args.additional_config or {}):
        return args
    if args.create_engine_config().use_v2_model_runner:
        return args
    log.warning("Model Runner V1 on this model: FULL decode graphs at width 1 + K only")
    return engine_args(settings, capture=False)
