"""The replica's phase in process: loading, calibrating, ready, restarting, draining.

The app's lifespan runs in a task of its own, as `spec-gateway serve` runs it
(`gateway.server`), while the test asks `/health`, `/ready`, `/metrics` and the OpenAI
routes. Each stage is held by the test, not by the clock: the engine starts only once
`Stages.load` is set, the first engine starts stopped (`FakeEngine.wedge`) so that the
calibration waits mid-way, and a restarted engine starts only once `Stages.restart` is.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

from engine.fake import FakeEngine, FakeEngineConfig
from engine.fake_frontend import FakeFrontend, FakeFrontendConfig
from gateway.app import RuntimeFactory, create_app
from gateway.calibration import calibrate, rounds_in_all
from gateway.control.cost_model import CostModel
from gateway.control.settings import ControllerSettings
from gateway.phase import Phase, PhaseBoard
from gateway.runtime import Runtime, _control_plane
from gateway.settings import GatewaySettings
from gateway.supervisor import EngineSlot, EngineSupervisor
from tests.unit.conftest import BASE_URL, MESSAGES, MODEL, USER_KEY, gateway_settings

pytestmark = pytest.mark.asyncio(loop_scope="session")

#: Steps of no duration: the fake engine's time does not matter here, only the order.
INSTANT = FakeEngineConfig(step_time=lambda k, batch: 0.0)
CALIBRATED = ControllerSettings(calibrate_batches=[1], calibrate_tokens=4)
NONE = ControllerSettings(calibrate_batches=[])


@dataclass
class Stages:
    """What the test holds: the engine's load, the first engine stopped, the restart."""

    load: asyncio.Event = field(default_factory=asyncio.Event)
    restart: asyncio.Event = field(default_factory=asyncio.Event)
    wedge_first: bool = False
    engines: list[FakeEngine] = field(default_factory=list)


def staged_factory(stages: Stages, controller: ControllerSettings) -> RuntimeFactory:
    """The fake backend's runtime (`gateway.runtime.runtime_factory`), its engine
    starts held by `stages` and its supervisor polling without a pause."""

    @asynccontextmanager
    async def factory(settings: GatewaySettings) -> AsyncIterator[Runtime]:
        @asynccontextmanager
        async def start_engine() -> AsyncIterator[FakeEngine]:
            await (stages.restart if stages.engines else stages.load).wait()
            engine = FakeEngine(INSTANT)
            if stages.wedge_first and not stages.engines:
                engine.wedge()
            stages.engines.append(engine)
            try:
                yield engine
            finally:
                await engine.shutdown()

        async def frontend(engine: Any) -> FakeFrontend:
            return FakeFrontend(engine, FakeFrontendConfig(served_model_name=MODEL))

        slot = EngineSlot(start_engine, frontend)
        async with AsyncExitStack() as stack:
            await slot.start()
            stack.push_async_callback(slot.close)
            runtime = await _control_plane(stack, settings, controller, slot)
            supervisor = EngineSupervisor(
                slot,
                on_down=runtime.engine_down,
                on_up=runtime.engine_up,
                on_fatal=runtime.fatal,
                interval_s=0.0,
                backoff_s=0.0,
            )
            supervisor.start()
            stack.push_async_callback(supervisor.close)
            try:
                yield runtime
            finally:
                await runtime.begin_drain()

    return factory


@dataclass
class Starting:
    http: httpx.AsyncClient
    phases: PhaseBoard
    app: Any

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{BASE_URL}/v1", api_key=USER_KEY, http_client=self.http, max_retries=0
        )

    async def chat(self) -> Any:
        return await self.client().chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=2,
        )


@asynccontextmanager
async def starting(stages: Stages, controller: ControllerSettings) -> AsyncIterator[Starting]:
    """The app with its lifespan entered in a background task; exited on the way out."""
    app = create_app(gateway_settings(), staged_factory(stages, controller))
    stop = asyncio.Event()

    async def hold() -> None:
        async with app.router.lifespan_context(app):
            await stop.wait()

    task = asyncio.create_task(hold())
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(transport=transport, base_url=BASE_URL) as http:
            yield Starting(http, app.state.phases, app)
    finally:
        stages.load.set()
        stages.restart.set()
        for engine in stages.engines:
            engine.resume()
        stop.set()
        await task


async def until(holds: Callable[[], bool], what: str) -> None:
    """Yield to the loop until `holds()` (bounded by turns, not by a clock)."""
    for _ in range(20_000):
        if holds():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{what}: not reached")


def phase_gauge(exposition: str) -> dict[str, float]:
    return {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith("specgw_phase{")
    }


async def test_while_loading_the_probes_answer_and_the_openai_routes_say_503() -> None:
    stages = Stages()
    async with starting(stages, NONE) as gw:
        await asyncio.sleep(0)
        assert gw.phases.phase is Phase.LOADING
        assert not stages.engines

        health = await gw.http.get("/health")
        ready = await gw.http.get("/ready")
        metrics = (await gw.http.get("/metrics")).text
        models = await gw.http.get("/v1/models", headers={"authorization": f"Bearer {USER_KEY}"})
        with pytest.raises(openai.APIStatusError) as refused:
            await gw.chat()

        assert (health.status_code, health.json()) == (200, {"status": "ok", "phase": "loading"})
        assert ready.status_code == 503
        assert ready.json() == {
            "ready": False,
            "phase": "loading",
            "progress": None,
            "detail": {"engine": "starting"},
        }
        assert phase_gauge(metrics) == {
            "loading": 1.0,
            "calibrating": 0.0,
            "ready": 0.0,
            "restarting": 0.0,
            "draining": 0.0,
        }
        assert "specgw_open_connections" in metrics
        for answer in (refused.value.response, models):
            assert answer.status_code == 503
            assert answer.headers["retry-after"] == "5"
            error = answer.json()["error"]
            assert (error["type"], error["code"]) == ("service_unavailable", "not_ready")
            assert error["message"] == "Not ready: the engine is loading; retry later."


async def test_calibration_reports_its_rounds_then_the_replica_is_ready() -> None:
    stages = Stages(wedge_first=True)
    async with starting(stages, CALIBRATED) as gw:
        stages.load.set()
        await until(lambda: gw.phases.phase is Phase.CALIBRATING, "calibrating")
        ready = (await gw.http.get("/ready")).json()
        health = (await gw.http.get("/health")).json()
        with pytest.raises(openai.APIStatusError) as refused:
            await gw.chat()

        samples = math.ceil(CALIBRATED.cost_min_samples)
        total = rounds_in_all(INSTANT.max_depth, [1], samples)
        assert ready["phase"] == "calibrating"
        assert ready["progress"] == {"done": 0, "total": total, "unit": "rounds"}
        assert health == {"status": "ok", "phase": "calibrating"}
        message = refused.value.response.json()["error"]["message"]
        assert (
            message == f"Not ready: the engine is being calibrated (0/{total} rounds); retry later."
        )

        stages.engines[0].resume()
        await until(lambda: gw.app.state.runtime is not None, "ready")
        ready_now = await gw.http.get("/ready")
        assert ready_now.status_code == 200
        assert ready_now.json()["phase"] == "ready"
        assert ready_now.json()["progress"] is None
        assert [p for p, _ in gw.phases.history] == [
            Phase.LOADING,
            Phase.CALIBRATING,
            Phase.READY,
        ]
        assert (await gw.chat()).choices[0].finish_reason == "length"


async def test_while_the_engine_restarts_health_stays_green(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="specgw")
    stages = Stages()
    stages.load.set()
    async with starting(stages, NONE) as gw:
        await until(lambda: gw.app.state.runtime is not None, "ready")
        stages.engines[0].kill()
        await until(lambda: gw.phases.phase is Phase.RESTARTING, "restarting")

        health = await gw.http.get("/health")
        ready = await gw.http.get("/ready")
        with pytest.raises(openai.APIStatusError) as refused:
            await gw.chat()
        metrics = phase_gauge((await gw.http.get("/metrics")).text)

        assert (health.status_code, health.json()) == (
            200,
            {"status": "ok", "phase": "restarting"},
        )
        assert ready.status_code == 503
        assert (ready.json()["phase"], ready.json()["detail"]["engine_state"]) == (
            "restarting",
            "restarting",
        )
        assert refused.value.status_code == 503
        assert "restarting" in refused.value.response.json()["error"]["message"]
        assert (metrics["restarting"], metrics["ready"]) == (1.0, 0.0)

        stages.restart.set()
        await until(lambda: gw.phases.phase is Phase.READY, "ready again")
        assert (await gw.http.get("/ready")).status_code == 200
        assert (await gw.chat()).choices[0].finish_reason == "length"
        assert len(stages.engines) == 2
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("phase ")]
    assert [m.split(" after ")[0] for m in said] == [
        "phase loading: starting the engine",
        "phase loading -> ready",
        "phase ready -> restarting",
        "phase restarting -> ready",
        "phase ready -> draining",
    ]


async def test_draining_is_a_phase_health_still_answers() -> None:
    stages = Stages()
    stages.load.set()
    async with starting(stages, NONE) as gw:
        await until(lambda: gw.app.state.runtime is not None, "ready")
        await gw.app.state.runtime.begin_drain()
        ready = await gw.http.get("/ready")
        health = await gw.http.get("/health")
        assert (ready.status_code, ready.json()["phase"]) == (503, "draining")
        assert ready.json()["detail"]["admission"] == "draining"
        assert (health.status_code, health.json()) == (200, {"status": "ok", "phase": "draining"})


def test_the_board_logs_one_line_per_transition_and_keeps_draining(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="specgw")
    now = [100.0]
    board = PhaseBoard(clock=lambda: now[0])
    board.enter(Phase.LOADING, "starting the engine")
    now[0] += 41.25
    board.enter(Phase.CALIBRATING)
    board.advance(3, 10, "rounds")
    board.enter(Phase.CALIBRATING)  # again: no line
    now[0] += 2.0
    assert board.seconds_in_phase() == 2.0
    assert board.report() == {
        "phase": "calibrating",
        "progress": {"done": 3, "total": 10, "unit": "rounds"},
    }
    board.enter(Phase.DRAINING, "SIGTERM")
    board.enter(Phase.READY)  # nothing leaves draining
    assert board.phase is Phase.DRAINING
    assert board.progress is None
    assert [r.getMessage() for r in caplog.records] == [
        "phase loading: starting the engine",
        "phase loading -> calibrating after 41.2 s",
        "phase calibrating -> draining after 2.0 s: SIGTERM",
    ]


async def test_calibration_progress_counts_every_round_to_the_total() -> None:
    engine = FakeEngine(INSTANT)
    seen: list[tuple[int, int]] = []
    cost = CostModel(engine.max_depth, 0.02, 0.08, 16.0, 2.0, 0.01)
    await calibrate(engine, cost, [1, 2], 4, 4, progress=lambda d, t: seen.append((d, t)))
    total = rounds_in_all(engine.max_depth, [1, 2], 4)
    assert seen == [(done, total) for done in range(total + 1)]
