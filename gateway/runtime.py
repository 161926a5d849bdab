"""Everything one replica runs, built in order and torn down in reverse.

`Runtime` is the typed app state the routes reach through dependencies;
`runtime_factory(engine_settings)` builds it on the backend the settings name (the
embedded vLLM engine, or the scripted fake): one factory for every backend.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from engine.backend import EngineBackend, PortConfig, load_backend
from engine.interface import Engine
from engine.port import ServingPort
from gateway import assembly
from gateway.admission import Admission
from gateway.clock import MONOTONIC, Clock
from gateway.control.controller import Controller
from gateway.control.events import FanOutEvents, LoggingEvents
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControllerSettings
from gateway.engine_watch import Conditions, EngineState, EngineWatch, engine_state
from gateway.flags import (
    FlagAdmin,
    FlagValues,
    FlagView,
)
from gateway.observability.events import MetricsEvents, SpanEvents
from gateway.phase import Phase, PhaseBoard, start_up_board
from gateway.planner import FlagOverrides
from gateway.replies import Telemetry
from gateway.service import InferenceService
from gateway.settings import GatewaySettings
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
    #: The replica's phase (`gateway.phase`): the supervisor's restarts and the drain move it.
    phases: PhaseBoard = field(default_factory=PhaseBoard)

    def engine_down(self) -> None:
        self.ready = False
        self.phases.enter(Phase.RESTARTING, "the engine core is down")
        self._changed()

    def engine_up(self, slot: EngineSlot) -> None:
        assert slot.frontend is not None
        self.engine, self.frontend = slot.engine, slot.frontend
        self.service.rebind(slot.frontend, slot.engine.abort)
        slot.engine.on_step(self.service.observe_step)
        self.ready = True
        self.phases.enter(Phase.READY, "engine restarted")
        self._changed()

    def fatal(self) -> None:
        self.failed = True
        self.ready = False
        self._changed()
        self.on_fatal()

    def begin_drain(self) -> asyncio.Task[None]:
        """Stop admitting (503 + retry-after); at the deadline, abort what still runs."""
        if self.drain_task is None:
            self.phases.enter(Phase.DRAINING, "finishing in-flight requests")
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

    async def liveness(self) -> tuple[str, str | None]:
        """`/health`'s status and detail from one health call: `dead` when the engine
        core is gone and cannot be replaced, `hung` when hung for `liveness_hung_s`
        without a break, else `ok`. A core that died is the supervisor's to replace in
        process (it looks every second, then the phase is `restarting`): until it gives
        up (`failed`, and the process exits), the replica is live."""
        watch = self.watch
        if watch is None:
            health = await self.engine.health()
            return ("ok", None) if health.alive or not self.failed else ("dead", health.detail)
        state, health = await watch.check()
        if not health.alive:
            return ("ok", None) if not self.failed else ("dead", health.detail)
        bound = self.settings.liveness_hung_s
        hung_s = watch.hung_for_s()
        if bound <= 0 or state is not EngineState.HUNG or hung_s < bound:
            return "ok", None
        why = watch.describe(state, health)
        return "hung", f"engine hung for {hung_s:.0f} s (bound {bound:g} s): {why}"

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
    telemetry: Telemetry | None,
    keys: KeyLimits | None = None,
) -> tuple[InferenceService, Admission]:
    """`keys`: per-key limits and fair-share weights (None: every key equal, unlimited)."""
    if keys is None:
        admission = Admission(settings.max_running, settings.max_queued, settings.queue_timeout_s)
    else:
        admission = keys.admission(settings)
    limiter = keys.limiter if keys is not None else None
    service = InferenceService(settings, frontend, plane, admission, telemetry, limiter)
    return service, admission


def runtime_factory(
    engine_settings: Any,
    controller_settings: ControllerSettings | None = None,
    *,
    backend: EngineBackend | None = None,
    clock: Clock = MONOTONIC,
) -> Callable[[GatewaySettings], AbstractAsyncContextManager[Runtime]]:
    """A runtime factory for `create_app` on a backend's engine and port: `backend`, else
    the one `engine_settings.backend` names in the registry (`engine.backend.PLUGINS`;
    ValueError for a name it does not know). The engine watch runs on `clock`."""
    plugin = backend if backend is not None else load_backend(engine_settings.backend)

    @asynccontextmanager
    async def factory(settings: GatewaySettings) -> AsyncIterator[Runtime]:
        library = plugin.library_version()
        target, _ = engine_settings.resolved_models()
        config = PortConfig(
            model=str(target),
            served_model_name=settings.served_names[0],
            served_aliases=tuple(settings.served_names[1:]),
            split_completion_prompts=settings.split_completion_control_tokens,
        )
        slot = EngineSlot(
            lambda: plugin.start_engine(engine_settings),
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
                drafter=drafter_name(drafter),
                vllm_version=library or "none",
                clock=clock,
            )
            supervisor = EngineSupervisor(
                slot,
                on_down=runtime.engine_down,
                on_up=runtime.engine_up,
                on_fatal=runtime.fatal,
            )
            supervisor.start()
            stack.push_async_callback(supervisor.close)
            if library is not None:  # a backend without an engine library has no heap to freeze
                freeze_startup_heap()
                # Given back to the collector on the way out, so that the interpreter's exit
                # frees the start-up heap (nanobind reports objects that outlive their
                # bindings as leaked).
                stack.callback(gc.unfreeze)
            log.info("spec-gateway ready (K=%d)", slot.engine.max_depth)
            try:
                yield runtime
            finally:
                await runtime.begin_drain()

    return factory


def freeze_startup_heap() -> None:
    """Move everything alive at start-up out of the collector's sight (`gc.freeze`).

    The engine's libraries leave about 600,000 tracked objects in this process; a full
    collection over them stalls the event loop (about 0.5 s: time `gc.collect()` after
    `import vllm`), which every stream and every shed answer waits out. vLLM's API server
    freezes its start-up heap for the same reason (`vllm.utils.gc_utils.freeze_gc_heap`).
    """
    gc.collect()
    gc.freeze()


def step_rule_on(settings: ControllerSettings, engine: Engine) -> bool:
    """`step_rule` resolved: `auto` is on where the engine verifies one depth per step."""
    if settings.step_rule == "auto":
        return engine.max_depth > 0 and engine.one_depth_per_step
    return settings.step_rule == "on"


async def _control_plane(
    stack: AsyncExitStack,
    settings: GatewaySettings,
    controller_settings: ControllerSettings,
    slot: EngineSlot,
    *,
    drafter: str = "none",
    vllm_version: str = "none",
    clock: Clock = MONOTONIC,
) -> Runtime:
    """Flags, controller, cluster sync, metrics, the service and the engine watch, on a
    started engine; `drafter` and `vllm_version` label `specgw_build_info`."""
    engine, frontend = slot.engine, slot.frontend
    assert frontend is not None
    phases = start_up_board()
    registry = CollectorRegistry()
    step_rule = step_rule_on(controller_settings, engine)
    metrics = assembly.replica_metrics(
        registry, settings, engine.max_depth, drafter, vllm_version, step_rule
    )
    # Every Redis client (flags, class store, rate limits) gets the same credentials and TLS.
    connection = RedisConnection.from_settings(settings)
    floor = controller_settings.batch_floor_for(engine.one_depth_per_step)
    view = await assembly.flag_view(stack, settings, connection, FlagValues(batch_floor=floor))
    events = FanOutEvents(LoggingEvents(), MetricsEvents(metrics), SpanEvents())
    controller = Controller(controller_settings, max_depth=engine.max_depth, events=events)
    calibration = await assembly.calibration(
        engine, controller, controller_settings, settings.max_running, phases
    )
    plane = ControlPlane(
        controller,
        overrides=FlagOverrides(view.overrides_for),
        step_rule=step_rule,
    )
    admin, store = await assembly.shared_state(stack, settings, connection, controller)
    telemetry = GatewayTelemetry(metrics, settings.served_names[0])
    keys = await KeyLimits.start(stack, settings, registry, connection)
    service, admission = build_service(settings, frontend, plane, telemetry, keys)
    service.set_aborter(engine.abort)
    engine.on_step(service.observe_step)  # after calibration: its requests are not in flight

    render, readiness_extra = assembly.reports(
        registry, metrics, admission, keys, controller, view, store
    )
    runtime = Runtime(
        settings=settings,
        engine=engine,
        frontend=frontend,
        plane=plane,
        admission=admission,
        service=service,
        render_metrics=render,
        class_report=lambda: [r.to_dict() for r in controller.snapshot()],
        cost_report=assembly.cost_report(controller, calibration),
        extra_readiness=readiness_extra,
        flag_view=view,
        flag_admin=admin,
        phases=phases,
    )
    runtime.watch = EngineWatch(
        lambda: slot.engine,
        runtime.conditions,
        metrics.set_engine_state,
        interval_s=settings.canary_interval_s,
        timeout_s=settings.canary_timeout_s,
        clock=clock,
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
