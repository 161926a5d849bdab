"""Everything one replica runs, built in order and torn down in reverse.

`Runtime` is the typed app state the routes reach through dependencies;
`real_runtime(settings, engine_settings)` builds it on the embedded vLLM engine.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from engine.interface import Engine
from engine.openai_frontend import FrontendConfig, OpenAIFrontend
from gateway.admission import Admission
from gateway.outcomes import OutcomeBoard
from gateway.planner import Planner, StaticPlanner
from gateway.service import InferenceService, Telemetry
from gateway.settings import GatewaySettings

log = logging.getLogger("specgw")


@dataclass
class Runtime:
    settings: GatewaySettings
    engine: Engine
    frontend: OpenAIFrontend
    planner: Planner
    admission: Admission
    board: OutcomeBoard
    service: InferenceService
    render_metrics: Callable[[], tuple[bytes, str]]
    class_report: Callable[[], list[dict[str, Any]]] = field(default=lambda: [])
    extra_readiness: Callable[[], dict[str, str]] = field(default=lambda: {})
    ready: bool = True
    drain_task: asyncio.Task[None] | None = None

    def begin_drain(self) -> asyncio.Task[None]:
        """Stop admitting (503 + retry-after); at the deadline, abort what still runs."""
        if self.drain_task is None:
            self.drain_task = asyncio.get_running_loop().create_task(self._drain())
        return self.drain_task

    async def _drain(self) -> None:
        if not await self.admission.drain(self.settings.drain_timeout_s):
            aborted = await self.service.abort_all()
            log.warning("drain deadline passed: aborted %d in-flight requests", aborted)
            # Give the relays a moment to send their error events before teardown.
            await self.admission.drain(2.0)

    async def readiness(self) -> dict[str, Any]:
        health = await self.engine.health()
        detail: dict[str, Any] = {
            "engine": "ready" if health.ready else (health.detail or "not ready"),
            "admission": "draining" if self.admission.draining else "open",
            "engine_running": health.running_requests,
            "engine_waiting": health.waiting_requests,
        }
        detail.update(self.extra_readiness())
        ok = health.alive and health.ready and not self.admission.draining and self.ready
        return {"ready": ok, "detail": detail}


def build_service(
    settings: GatewaySettings,
    frontend: OpenAIFrontend,
    planner: Planner,
    board: OutcomeBoard,
    telemetry: Telemetry | None,
) -> tuple[InferenceService, Admission]:
    admission = Admission(settings.max_running, settings.max_queued, settings.queue_timeout_s)
    service = InferenceService(settings, frontend, planner, board, admission, telemetry)
    return service, admission


def real_runtime_factory(
    engine_settings: Any,
) -> Callable[[GatewaySettings], AbstractAsyncContextManager[Runtime]]:
    """A runtime factory for `create_app` on the embedded vLLM engine."""

    @asynccontextmanager
    async def factory(settings: GatewaySettings) -> AsyncIterator[Runtime]:
        from engine.vllm_engine import VLLMEngine

        board = OutcomeBoard()
        async with AsyncExitStack() as stack:
            engine = await stack.enter_async_context(
                VLLMEngine.started(engine_settings, on_outcome=board.deliver)
            )
            frontend = await OpenAIFrontend.create(
                engine.serving_client,
                FrontendConfig(
                    model=str(engine_settings.model),
                    served_model_name=settings.served_model_name,
                ),
            )
            planner = StaticPlanner(min(settings.default_k, engine.max_depth))
            service, admission = build_service(settings, frontend, planner, board, None)
            runtime = Runtime(
                settings=settings,
                engine=engine,
                frontend=frontend,
                planner=planner,
                admission=admission,
                board=board,
                service=service,
                render_metrics=_default_metrics,
            )
            log.info("spec-gateway ready", extra={"max_depth": engine.max_depth})
            service.set_aborter(engine.abort)
            try:
                yield runtime
            finally:
                await runtime.begin_drain()

    return factory


def _default_metrics() -> tuple[bytes, str]:
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
