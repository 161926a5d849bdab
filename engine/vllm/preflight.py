"""Checks before the engine is built: a tested vLLM, models that exist and fit.

Each failure is one line (`PREFLIGHT_ERRORS`), so `spec-gateway serve` can print
it and exit instead of a traceback from deep inside vLLM minutes later: a wrong
vLLM version or a changed hook (`engine.vllm.compat`), a missing model, an unreadable
token file, a drafter that does not fit its target (`engine.vllm.model_source`), and a
batch-size schedule vLLM would refuse only when its engine core builds the
scheduler (`validate_and_normalize_dynamic_sd_schedule`; its config accepts it).
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


class EngineSettingsError(ValueError):
    """Settings the engine would refuse once started; the message is one line."""


#: What `preflight` raises; each message is one line.
PREFLIGHT_ERRORS: tuple[type[Exception], ...] = (
    VLLMCompatError,
    ModelSourceError,
    EngineSettingsError,
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


def preflight(settings: EngineSettings, environ: Mapping[str, str] | None = None) -> None:
    """vLLM first (nothing else matters on a wrong one), then the schedule and the models."""
    check_vllm()
    check_schedule(settings)
    check_models(settings, os.environ if environ is None else environ)


__all__ = [
    "PREFLIGHT_ERRORS",
    "EngineSettingsError",
    "check_models",
    "check_schedule",
    "preflight",
]
