"""Liveness, readiness, metrics, admission, drain and engine restarts, in process."""

from __future__ import annotations

import asyncio

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.control.settings import ControllerSettings
from tests.clock import until
from tests.spec_report import vllm_block
from tests.unit.conftest import (
    ADMIN_KEY,
    MESSAGES,
    MODEL,
    USER_KEY,
    InProcessGateway,
    gateway_settings,
    serve_in_process,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


def samples(exposition: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """A family's samples by sorted label pairs (Prometheus text format, parsed)."""
    out: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name == name:
                out[tuple(sorted(sample.labels.items()))] = sample.value
    return out


async def test_health_and_readiness(gateway: InProcessGateway) -> None:
    health = await gateway.http.get("/health")
    assert health.json() == {"status": "ok", "phase": "ready"}
    ready = await gateway.http.get("/ready")
    assert ready.status_code == 200
    body = ready.json()
    assert body["ready"] is True
    assert body["detail"]["engine"] == "ready"
    assert body["detail"]["admission"] == "open"


async def test_metrics_reconcile_with_the_replies(gateway: InProcessGateway) -> None:
    """Counters after traffic equal what the replies reported, request by request."""
    client = gateway.client()
    drafted = accepted = output = 0
    for i in range(5):
        reply = await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=10 + i, temperature=0
        )
        block = vllm_block(reply.model_extra or {})
        drafted += block["num_draft_tokens"]
        accepted += block["num_accepted_draft_tokens"]
        assert reply.usage is not None
        output += reply.usage.completion_tokens
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nope", messages=MESSAGES)
    text = (await gateway.http.get("/metrics")).text
    requests = samples(text, "specgw_requests_total")
    assert sum(v for k, v in requests.items() if ("status", "200") in k) == 5
    assert sum(v for k, v in requests.items() if ("status", "404") in k) == 1
    assert sum(samples(text, "specgw_draft_tokens_total").values()) == drafted
    assert sum(samples(text, "specgw_accepted_tokens_total").values()) == accepted
    assert sum(samples(text, "specgw_output_tokens_total").values()) == output
    assert samples(text, "specgw_engine_ready") == {(): 1.0}
    assert samples(text, "specgw_running_requests") == {(): 0.0}
    assert samples(text, "specgw_redis_state")[(("state", "disabled"),)] == 1.0


async def test_overload_is_shed_with_429(gateway: InProcessGateway) -> None:
    settings = gateway_settings(max_running=1, max_queued=0)
    async with serve_in_process(settings) as gw:
        client = gw.client(max_retries=0)
        results = await asyncio.gather(
            *(
                client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=40)
                for _ in range(4)
            ),
            return_exceptions=True,
        )
        shed = [r for r in results if isinstance(r, openai.RateLimitError)]
        served = [r for r in results if not isinstance(r, BaseException)]
        assert shed
        assert served
        assert len(shed) + len(served) == 4
        assert shed[0].response.headers["retry-after"]
        assert gw.runtime.admission.running == 0


async def test_drain_refuses_new_requests(gateway: InProcessGateway) -> None:
    await gateway.runtime.begin_drain()
    with pytest.raises(openai.InternalServerError) as caught:
        await gateway.client(max_retries=0).chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=2
        )
    assert caught.value.status_code == 503
    ready = await gateway.http.get("/ready")
    assert ready.status_code == 503
    assert ready.json()["detail"]["admission"] == "draining"


async def test_a_dead_engine_is_reported_then_replaced(gateway: InProcessGateway) -> None:
    """The supervisor sees the engine core die, restarts it, and serving resumes on the new
    engine (the service rebound to the new port). Liveness stays green all along: a dead
    core is replaced in process, only a replica that cannot replace it fails `/health`."""
    dead = gateway.engine
    dead.kill()
    assert (await gateway.http.get("/health")).status_code == 200
    assert (await gateway.http.get("/ready")).status_code == 503
    gateway.runtime.failed = True  # what the supervisor sets when every restart failed
    assert (await gateway.http.get("/health")).status_code == 503
    gateway.runtime.failed = False

    async def replaced() -> bool:
        return gateway.engine is not dead and (await gateway.http.get("/ready")).status_code == 200

    await until(replaced, 15.0, "engine restarted", poll_s=0.1)
    reply = await gateway.client().chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=3, temperature=0
    )
    assert reply.choices[0].finish_reason == "length"
    assert len(gateway.engine.outcomes) == 1  # served by the new engine


async def test_start_up_calibration_runs_on_the_fake_engine() -> None:
    controller = ControllerSettings(calibrate_batches=[1, 2], calibrate_tokens=8)
    async with serve_in_process(controller=controller) as gw:
        report = (await gw.http.get("/admin/costs", headers=gw.auth(ADMIN_KEY))).json()
        points = {(p["batch"], p["k"]) for p in report["calibration"]}
        assert points == {(b, k) for b in (1, 2) for k in range(gw.engine.max_depth + 1)}
        assert {p["timed_by"] for p in report["calibration"]} == {"requests"}  # no step clock
        ready = await gw.http.get("/ready", headers=gw.auth(USER_KEY))
        assert ready.status_code == 200
