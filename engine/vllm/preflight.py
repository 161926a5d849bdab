"""Checks before the engine is built: a tested vLLM, models that exist and fit.

Each failure is one line (`PREFLIGHT_ERRORS`), so `spec-gateway serve` can print
it and exit instead of a traceback from deep inside vLLM minutes later: a wrong
vLLM version or a changed hook (`engine.vllm.compat`), a missing model, an unreadable
token file, a drafter that does not fit its target (`engine.vllm.model_source`), and a
batch-size schedule vLLM would refuse only when its engine core builds the
scheduler (`validate_and_normalize_dynamic_sd_schedule`; its config accepts it), and a
tool or reasoning parser that cannot be chosen without guessing or that vLLM does not
have (`engine.vllm.parsers`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from engine.settings import EngineSettings
from engine.vllm.compat import VLLMCompatError, check_vllm
from engine.vllm.model_source import (
    ModelSourceError,
    check_fit,
    hub_token,
    model_source,
    read_config,
)
from engine.vllm.parsers import ParserChoiceError, check_parsers_known, resolved_parsers


class EngineSettingsError(ValueError):
    """Settings the engine would refuse once started; the message is one line."""


#: What `preflight` raises; each message is one line.
PREFLIGHT_ERRORS: tuple[type[Exception], ...] = (
    VLLMCompatError,
    ModelSourceError,
    EngineSettingsError,
    ParserChoiceError,
)


def check_models(settings: EngineSettings, environ: Mapping[str, str]) -> None:
    """Target (and drafter, when the engine speculates) found, readable and paired."""
    target_ref, drafter_ref = settings.resolved_models()
    token = hub_token(environ)
    target = model_source(target_ref, "target")
    target_config = read_config(target, token)
    if drafter_ref is None or settings.max_depth == 0:
        return
    drafter = model_source(drafter_ref, "drafter")
    check_fit(target, target_config, drafter, read_config(drafter, token))


def check_schedule(settings: EngineSettings) -> None:
    """The batch-size schedule as vLLM's scheduler will read it (rows from batch size 1)."""
    if not settings.spec_tokens_per_batch_size:
        return
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    try:
        validate_and_normalize_dynamic_sd_schedule(
            [list(row) for row in settings.spec_tokens_per_batch_size]
        )
    except ValueError as exc:
        raise EngineSettingsError(f"spec_tokens_per_batch_size: {exc}") from exc


#: The oldest NVIDIA driver each CUDA major's user-space libraries run on (NVIDIA's CUDA
#: toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions"): the CUDA
#: build's torch 2.14.0 is cu130 (`deploy/constraints/cuda.txt`).
CUDA_DRIVER_FLOOR: dict[int, int] = {12: 525, 13: 580}


def check_driver(cuda_runtime: str | None, driver: str | None) -> None:
    """Refuse a visible GPU whose driver is older than the CUDA build needs.

    `cuda_runtime`: torch's CUDA version (`torch.version.cuda`, None on a CPU build);
    `driver`: the NVIDIA driver's version (NVML), None where no GPU is visible. An old
    driver fails at the first CUDA call, after the weights have downloaded.
    """
    if not cuda_runtime or not driver:
        return
    floor = CUDA_DRIVER_FLOOR.get(int(cuda_runtime.split(".")[0]))
    if floor is not None and int(driver.split(".")[0]) < floor:
        raise EngineSettingsError(
            f"NVIDIA driver {driver} is older than {floor}, the oldest that runs CUDA "
            f"{cuda_runtime} (this build's torch): upgrade the node's driver, or run a "
            "build of spec-gateway for an older CUDA"
        )


def visible_driver() -> tuple[str | None, str | None]:
    """(torch's CUDA version, the NVIDIA driver's version), None where there is none."""
    import torch

    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML library, no GPU, no driver: nothing to check
        return torch.version.cuda, None
    text = driver.decode() if isinstance(driver, bytes) else str(driver)
    return torch.version.cuda, text


def preflight(settings: EngineSettings, environ: Mapping[str, str] | None = None) -> None:
    """vLLM first (nothing else matters on a wrong one), then the schedule and the models."""
    check_vllm()
    check_driver(*visible_driver())
    check_schedule(settings)
    env = os.environ if environ is None else environ
    check_models(settings, env)
    check_parsers_known(resolved_parsers(settings, env))


__all__ = [
    "PREFLIGHT_ERRORS",
    "EngineSettingsError",
    "check_driver",
    "check_models",
    "check_schedule",
    "preflight",
]
