"""Everything one replica runs, built in order and torn down in reverse.

`Runtime` is the typed app state the routes reach through dependencies;
`real_runtime(settings, engine_settings)` builds it on the embedded vLLM engine.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from engine.backend import PortConfig
from engine.interface import Engine
from engine.port import ServingPort
from gateway.admission import Admission
from gateway.calibration import CalibrationPoint, calibrate
from gateway.cluster import ClusterSync
from gateway.control.controller import Controller
from gateway.control.events import FanOutEvents, LoggingEvents
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControllerSettings
from gateway.engine_watch import Conditions, EngineState, EngineWatch, engine_state
from gateway.flags import (
    SPECS,
    FlagAdmin,
    FlagValues,
    FlagView,
    RedisOverrideProvider,
)
from gateway.observability.events import MetricsEvents, SpanEvents, export_class_reports
from gateway.observability.metrics import GatewayMetrics, render_metrics
from gateway.observability.replica_metrics import BuildInfo
from gateway.outcomes import OutcomeBoard
from gateway.planner import FlagOverrides
from gateway.plugins import load_backend
from gateway.replies import Telemetry
from gateway.service import InferenceService
from gateway.settings import GatewaySettings
from gateway.state import RedisClassStore
from gateway.state.connection import RedisConnection
from gateway.supervisor import EngineSlot, EngineSupervisor
from gateway.telemetry import GatewayTelemetry
from gateway.tenants.replica import KeyLimits

log = logging.getLogger("specgw")


@dataclass
class Runtime:
    settings: GatewaySettings
    engine: Engine
    frontend: ServingPort
    plane: ControlPlane
    admission: Admission
    board: OutcomeBoard
    service: InferenceService
    render_metrics: Callable[[], tuple[bytes, str]]
    class_report: Callable[[], list[dict[str, Any]]] = field(default=lambda: [])
    #: The cost model as the policy sees it, and the start-up calibration behind it.
    cost_report: Callable[[], dict[str, Any]] = field(default=lambda: {})
    extra_readiness: Callable[[], dict[str, str]] = field(default=lambda: {})
    flag_view: FlagView | None = None
    flag_admin: FlagAdmin | None = None
    ready: bool = True
    drain_task: asyncio.Task[None] | None = None
    #: Set when the engine cannot be restarted: the process must exit non-zero.
    failed: bool = False
    on_fatal: Callable[[], None] = field(default=lambda: None)
    #: Keeps the engine's state current (canary, metrics); None: computed on each call.
    watch: EngineWatch | None = None

    def engine_down(self) -> None:
        self.ready = False
        self._changed()

    def engine_up(self, slot: EngineSlot) -> None:
        assert slot.frontend is not None
        self.engine, self.frontend = slot.engine, slot.frontend
        self.service.rebind(slot.frontend, slot.engine.abort)
        slot.engine.on_step(self.service.observe_step)
        self.ready = True
        self._changed()

    def fatal(self) -> None:
        self.failed = True
        self.ready = False
        self._changed()
        self.on_fatal()

    def begin_drain(self) -> asyncio.Task[None]:
        """Stop admitting (503 + retry-after); at the deadline, abort what still runs."""
        if self.drain_task is None:
            self.drain_task = asyncio.get_running_loop().create_task(self._drain())
            self._changed()
        return self.drain_task

    def conditions(self) -> Conditions:
        return Conditions(
            restarting=not self.ready and not self.failed,
            failed=self.failed,
            draining=self.admission.draining,
        )

    def _changed(self) -> None:
        if self.watch is not None:
            self.watch.poke()

    async def _drain(self) -> None:
        if not await self.admission.drain(self.settings.drain_timeout_s):
            aborted = await self.service.abort_all()
            log.warning("drain deadline passed: aborted %d in-flight requests", aborted)
            # Give the relays a moment to send their error events before teardown.
            await self.admission.drain(2.0)

    async def readiness(self) -> dict[str, Any]:
        if self.watch is not None:
            state, health = await self.watch.check()
            engine = self.watch.describe(state, health)
        else:
            health = await self.engine.health()
            state = engine_state(health, self.conditions())
            engine = "ready" if state is EngineState.READY else health.detail or state.value
        detail: dict[str, Any] = {
            "engine": engine,
            "engine_state": state.value,
            "admission": "draining" if self.admission.draining else "open",
            "engine_running": health.running_requests,
            "engine_waiting": health.waiting_requests,
        }
        detail.update(self.extra_readiness())
        return {"ready": state is EngineState.READY, "detail": detail}


def build_service(
    settings: GatewaySettings,
    frontend: ServingPort,
    plane: ControlPlane,
    board: OutcomeBoard,
    telemetry: Telemetry | None,
    keys: KeyLimits | None = None,
) -> tuple[InferenceService, Admission]:
    """`keys`: per-key limits and fair-share weights (None: every key equal, unlimited)."""
    if keys is None:
        admission = Admission(settings.max_running, settings.max_queued, settings.queue_timeout_s)
    else:
        admission = keys.admission(settings)
    limiter = keys.limiter if keys is not None else None
    service = InferenceService(settings, frontend, plane, board, admission, telemetry, limiter)
    return service, admission


def real_runtime_factory(
    engine_settings: Any,
    controller_settings: ControllerSettings | None = None,
    *,
    backend: str = "vllm",
) -> Callable[[GatewaySettings], AbstractAsyncContextManager[Runtime]]:
    """A runtime factory for `create_app` on a plugged-in backend's engine
    (`gateway.plugins`; the embedded vLLM engine by default)."""

    @asynccontextmanager
    async def factory(settings: GatewaySettings) -> AsyncIterator[Runtime]:
        plugin = load_backend(backend)
        vllm_version = plugin.library_version() or "none"

        board = OutcomeBoard()
        target, _ = engine_settings.resolved_models()
        config = PortConfig(
            model=str(target),
            served_model_name=settings.served_model_name,
            split_completion_prompts=settings.split_completion_control_tokens,
        )
        slot = EngineSlot(
            lambda: plugin.start_engine(engine_settings, board.deliver),
            lambda engine: plugin.serving_port(engine, config),
        )
        async with AsyncExitStack() as stack:
            await slot.start()
            stack.push_async_callback(slot.close)
            control = controller_settings or ControllerSettings()
            drafter = engine_settings.resolved_models()[1] if slot.engine.max_depth else None
            runtime = await _control_plane(
                stack,
                settings,
                control,
                slot,
                board,
                drafter=drafter_name(drafter),
                vllm_version=vllm_version,
            )
            supervisor = EngineSupervisor(
                slot,
                on_down=runtime.engine_down,
                on_up=runtime.engine_up,
                on_fatal=runtime.fatal,
            )
            supervisor.start()
            stack.push_async_callback(supervisor.close)
            log.info("spec-gateway ready (K=%d)", slot.engine.max_depth)
            try:
                yield runtime
            finally:
                await runtime.begin_drain()

    return factory


async def _control_plane(
    stack: AsyncExitStack,
    settings: GatewaySettings,
    controller_settings: ControllerSettings,
    slot: EngineSlot,
    board: OutcomeBoard,
    *,
    drafter: str = "none",
    vllm_version: str = "none",
) -> Runtime:
    """Flags, controller, cluster sync, metrics, the service and the engine watch, on a
    started engine; `drafter` and `vllm_version` label `specgw_build_info`."""
    engine, frontend = slot.engine, slot.frontend
    assert frontend is not None
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry, max_depth=engine.max_depth, flags=tuple(SPECS))
    metrics.set_build_info(
        BuildInfo(
            version=package_version("spec-gateway"),
            model=settings.served_model_name,
            drafter=drafter,
            vllm_version=vllm_version,
            max_depth=engine.max_depth,
        )
    )
    # Every Redis client (flags, class store, rate limits) gets the same credentials and TLS.
    connection = RedisConnection.from_settings(settings)
    flag_settings = settings.flags  # flags_dir, redis_url, namespace: the top level's
    overrides = None
    if connection is not None:
        timeout = flag_settings.op_timeout_s
        redis = connection.client(op_timeout_s=timeout, connect_timeout_s=timeout)
        overrides = RedisOverrideProvider(flag_settings, redis)
    view = FlagView(flag_settings, overrides=overrides)
    await view.start()
    stack.push_async_callback(view.close)
    events = FanOutEvents(LoggingEvents(), MetricsEvents(metrics), SpanEvents())
    controller = Controller(controller_settings, max_depth=engine.max_depth, events=events)
    calibration: list[CalibrationPoint] = []
    if controller_settings.calibrate_batches and engine.max_depth > 0:
        calibration = await calibrate(
            engine,
            controller.cost_model,
            controller_settings.calibrate_batches,
            controller_settings.calibrate_tokens,
            math.ceil(controller_settings.cost_min_samples),
        )
    plane = ControlPlane(controller, overrides=FlagOverrides(view.overrides_for))
    store: RedisClassStore | None = None
    admin: FlagAdmin | None = None
    if connection is not None:
        timeout = flag_settings.op_timeout_s * 4  # as FlagAdmin.connect: one retry
        redis = connection.client(op_timeout_s=timeout, connect_timeout_s=timeout, retries=1)
        admin = FlagAdmin(redis, flag_settings)
        stack.push_async_callback(admin.close)
        state = settings.state
        redis = connection.client(
            op_timeout_s=state.op_timeout_s, connect_timeout_s=state.connect_timeout_s
        )
        store = RedisClassStore(state, redis)
        await store.start()
        stack.push_async_callback(store.close)
        sync = ClusterSync(controller, store)
        sync.start()
        stack.push_async_callback(sync.close)
    telemetry = GatewayTelemetry(metrics, settings.served_model_name)
    keys = await KeyLimits.start(stack, settings, registry, connection)
    service, admission = build_service(settings, frontend, plane, board, telemetry, keys)
    service.set_aborter(engine.abort)
    engine.on_step(service.observe_step)  # after calibration: its requests are not in flight

    def render() -> tuple[bytes, str]:
        metrics.set_load(admission.queued, admission.running)
        keys.export(admission)
        export_class_reports(metrics, controller.snapshot())
        flags = view.overrides_for("", "")
        metrics.set_flags(flag_gauges(flags))
        if store is None:
            metrics.set_redis_state("disabled")
        else:
            metrics.set_redis_state("up" if store.status == "ok" else "degraded")
        return render_metrics(registry)

    def readiness_extra() -> dict[str, str]:
        extra: dict[str, str] = {}
        if store is not None:
            extra["redis"] = store.status
        if view.redis_status is not None:
            extra["flags_redis"] = view.redis_status
        extra.update(keys.readiness())
        return extra

    runtime = Runtime(
        settings=settings,
        engine=engine,
        frontend=frontend,
        plane=plane,
        admission=admission,
        board=board,
        service=service,
        render_metrics=render,
        class_report=lambda: [r.to_dict() for r in controller.snapshot()],
        cost_report=lambda: {
            "calibration": [p.to_dict() for p in calibration],
            "buckets": controller.cost_model.report(),
            "prefill_ms_per_token": round(controller.cost_model.prefill_s * 1000, 4),
        },
        extra_readiness=readiness_extra,
        flag_view=view,
        flag_admin=admin,
    )
    runtime.watch = EngineWatch(
        lambda: slot.engine,
        runtime.conditions,
        metrics.set_engine_state,
        interval_s=settings.canary_interval_s,
        timeout_s=settings.canary_timeout_s,
    )
    runtime.watch.start()
    stack.push_async_callback(runtime.watch.close)
    return runtime


def drafter_name(drafter: Path | str | None) -> str:
    """The drafter as `specgw_build_info` labels it: a local directory by its name (the
    embedded `eagle3.1`), a Hugging Face id as written; `none` without one."""
    if drafter is None:
        return "none"
    path = Path(drafter)
    return path.name if path.is_dir() else str(drafter)


def package_version(distribution: str) -> str:
    """An installed distribution's version, `none` where it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def flag_gauges(values: FlagValues) -> list[tuple[str, float]]:
    """Global flag values as numbers for `specgw_flag_state{flag}`."""
    modes = {"adaptive": 0.0, "static": 1.0, "shadow": 2.0}
    return [
        ("speculation-enabled", 1.0 if values.enabled else 0.0),
        ("controller-mode", modes.get(values.mode, -1.0)),
        ("pin-k", -1.0 if values.pin_k is None else float(values.pin_k)),
        ("k-min", float(values.k_min)),
        ("k-max", float(values.k_max)),
        ("exploration-share", float(values.exploration_share)),
        ("batch-floor", float(values.batch_floor)),
    ]
