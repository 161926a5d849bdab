"""The vLLM backend as the registry loads it (`engine.vllm.backend:BACKEND` in
`engine.backend.PLUGINS`).

Importing this module imports no vLLM: each method imports what it needs, so
`spec-gateway --version` (which reads `library_version`) stays fast.
"""

from __future__ import annotations

import os
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

from engine.backend import PortConfig, PreflightError

if TYPE_CHECKING:
    from engine.port import ServingPort


class VLLMBackend:
    """The embedded vLLM engine behind vLLM's own OpenAI serving layer."""

    def library_version(self) -> str | None:
        from engine.vllm.compat import VLLMCompatError, installed_vllm_version

        try:
            return installed_vllm_version()
        except VLLMCompatError:
            return None

    def preflight(self, engine_settings: Any) -> None:
        from engine.vllm.preflight import PREFLIGHT_ERRORS, preflight

        try:
            preflight(engine_settings)
        except PREFLIGHT_ERRORS as exc:
            raise PreflightError(str(exc)) from exc

    def startup_plan(
        self, engine_settings: Any, max_running: int | None, gpu_memory_gib: float
    ) -> str:
        from engine.vllm.plan import PlanError, render, startup_plan
        from engine.vllm.preflight import PREFLIGHT_ERRORS, preflight

        try:
            preflight(engine_settings)
            plan = startup_plan(
                engine_settings, max_running, os.environ, gpu_memory_gib=gpu_memory_gib
            )
        except (*PREFLIGHT_ERRORS, PlanError) as exc:  # type: ignore[misc]
            raise PreflightError(str(exc)) from exc
        return render(plan, gpu_memory_gib)

    def start_engine(self, engine_settings: Any) -> AbstractAsyncContextManager[Any]:
        from engine.vllm.engine import VLLMEngine

        return VLLMEngine.started(engine_settings)

    async def serving_port(self, engine: Any, config: PortConfig) -> ServingPort:
        from engine.vllm.openai_frontend import FrontendConfig, OpenAIFrontend
        from engine.vllm.parsers import resolved_parsers

        parsers = resolved_parsers(engine.settings, os.environ)
        frontend = FrontendConfig(
            model=config.model,
            served_model_name=config.served_model_name,
            served_aliases=config.served_aliases,
            tool_call_parser=parsers.tool_call,
            reasoning_parser=parsers.reasoning,
            split_completion_prompts=config.split_completion_prompts,
        )
        return await OpenAIFrontend.create(
            engine.serving_client,
            frontend,
            lossless_sampling=engine.lossless_sampling,
            outcomes=engine.outcome_tap,
        )


BACKEND = VLLMBackend()
