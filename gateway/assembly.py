"""The pieces of a replica's control plane that `gateway.runtime._control_plane` puts
together: the flags, start-up calibration, the state replicas share through Redis, and
what `/metrics` and `/ready` read at request time."""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Callable
from contextlib import AsyncExitStack
from typing import Any

from prometheus_client import CollectorRegistry

from engine.interface import Engine
from gateway.admission import Admission
from gateway.calibration import CalibrationPoint, calibrate, calibration_batches
from gateway.cluster import ClusterSync
from gateway.control.controller import Controller
from gateway.control.settings import ControllerSettings
from gateway.flags import SPECS, FlagAdmin, FlagValues, FlagView, RedisOverrideProvider
from gateway.observability.events import export_class_reports
from gateway.observability.metrics import GatewayMetrics, render_metrics
from gateway.observability.replica_metrics import BuildInfo
from gateway.phase import Phase, PhaseBoard
from gateway.settings import GatewaySettings
from gateway.state import RedisClassStore
from gateway.state.connection import RedisConnection
from gateway.tenants.replica import KeyLimits


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


def package_version(distribution: str) -> str:
    """An installed distribution's version, `none` where it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def replica_metrics(
    registry: CollectorRegistry,
    settings: GatewaySettings,
    max_depth: int,
    drafter: str,
    vllm_version: str,
    step_rule: bool = False,
) -> GatewayMetrics:
    """The replica's metrics, `specgw_build_info` set (`drafter`, `vllm_version` label it)."""
    metrics = GatewayMetrics(registry, max_depth=max_depth, flags=tuple(SPECS))
    info = BuildInfo(
        version=package_version("spec-gateway"),
        model=settings.served_names[0],
        drafter=drafter,
        vllm_version=vllm_version,
        max_depth=max_depth,
        step_rule=step_rule,
    )
    metrics.set_build_info(info)
    return metrics


def cost_report(
    controller: Controller, calibration: list[CalibrationPoint]
) -> Callable[[], dict[str, Any]]:
    """`/admin/costs`: the start-up calibration and the cost model's buckets now."""

    def report() -> dict[str, Any]:
        return {
            "calibration": [p.to_dict() for p in calibration],
            "buckets": controller.cost_model.report(),
            "prefill_ms_per_token": round(controller.cost_model.prefill_s * 1000, 4),
        }

    return report


def reports(
    registry: CollectorRegistry,
    metrics: GatewayMetrics,
    admission: Admission,
    keys: KeyLimits,
    controller: Controller,
    view: FlagView,
    store: RedisClassStore | None,
) -> tuple[Callable[[], tuple[bytes, str]], Callable[[], dict[str, str]]]:
    """(`/metrics` rendered with the gauges read at scrape time, `/ready`'s extra fields)."""

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

    return render, readiness_extra


async def flag_view(
    stack: AsyncExitStack,
    settings: GatewaySettings,
    connection: RedisConnection | None,
    defaults: FlagValues | None = None,
) -> FlagView:
    """The flags: file defaults, with Redis overrides where Redis is configured;
    `defaults` where neither sets a flag (the code's `FlagValues()` if None)."""
    flag_settings = settings.flags  # flags_dir, redis_url, namespace: the top level's
    overrides = None
    if connection is not None:
        timeout = flag_settings.op_timeout_s
        redis = connection.client(op_timeout_s=timeout, connect_timeout_s=timeout)
        overrides = RedisOverrideProvider(flag_settings, redis)
    view = FlagView(flag_settings, defaults=defaults, overrides=overrides)
    await view.start()
    stack.push_async_callback(view.close)
    return view


async def calibration(
    engine: Engine,
    controller: Controller,
    controller_settings: ControllerSettings,
    max_running: int,
    phases: PhaseBoard | None = None,
) -> list[CalibrationPoint]:
    """Start-up calibration of the cost model (none without a drafter or batches), in the
    `calibrating` phase of `phases` with its rounds as the progress."""
    batches = calibration_batches(
        controller_settings.calibrate_batches, engine.one_depth_per_step, max_running
    )
    if not batches or engine.max_depth <= 0:
        return []
    board = phases or PhaseBoard()
    board.enter(Phase.CALIBRATING, f"batch sizes {' '.join(map(str, batches))}")
    return await calibrate(
        engine,
        controller.cost_model,
        batches,
        controller_settings.calibrate_tokens,
        math.ceil(controller_settings.cost_min_samples),
        progress=lambda done, total: board.advance(done, total, "rounds"),
    )


async def shared_state(
    stack: AsyncExitStack,
    settings: GatewaySettings,
    connection: RedisConnection | None,
    controller: Controller,
) -> tuple[FlagAdmin | None, RedisClassStore | None]:
    """Where Redis is configured: the flag admin and the class store the replicas share
    (synced into the controller); (None, None) otherwise."""
    if connection is None:
        return None, None
    timeout = settings.flags.op_timeout_s * 4  # as FlagAdmin.connect: one retry
    redis = connection.client(op_timeout_s=timeout, connect_timeout_s=timeout, retries=1)
    admin = FlagAdmin(redis, settings.flags)
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
    return admin, store
