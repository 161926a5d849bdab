"""Two gateway replicas on one real redis-server: shared class state, flags, kill switch.

Each replica is a real `spec-gateway serve` process with its own vLLM engine
(the tiny model unless the embedded one is built); flags are flipped through
the real CLI (`spec-gateway flags set`), as an operator would. A third replica, started
by the restart test after the class's history is in Redis, reaches Redis through a
delaying proxy; the slow-Redis test, last, uses it.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.conftest import (
    ADMIN_KEY,
    NO_CALIBRATION,
    REPO,
    GatewayProcess,
    start_gateway,
    start_replicas,
    stop_gateway,
    stop_gateways,
    wait_for,
)
from tests.redis_fixtures import DelayProxy, RedisServer
from tests.spec_report import vllm_block

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "specgw-default"
BODY = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "What does os.path.join do?"}],
    "max_tokens": 8,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def replicas(
    module_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[GatewayProcess]]:
    # No start-up calibration: the kill-switch test needs speculation to come back once
    # the switch is off, and on a CPU the calibrated policy (first-token price, step
    # costs) rightly runs its short replies at k = 0; from the cost prior it speculates.
    env = {
        "SPECGW_REDIS_URL": module_redis.url,
        "SPECGW_NAMESPACE": "cluster-test",
        **NO_CALIBRATION,
    }
    gateways = start_replicas(tmp_path_factory.mktemp("replicas"), env)
    yield gateways
    stop_gateways(gateways)


def chat(gw: GatewayProcess) -> httpx.Response:
    with gw.http() as http:
        response = http.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 200, response.text
    return response


def classes(gw: GatewayProcess) -> dict[str, dict[str, object]]:
    with gw.http(ADMIN_KEY) as http:
        rows = http.get("/admin/classes").json()["data"]
    return {row["label"]: row for row in rows}


def cli(gw: GatewayProcess, *args: str) -> str:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli",
            *args,
            "--url",
            gw.base_url,
            "--admin-key",
            ADMIN_KEY,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_replicas_share_class_statistics(replicas: list[GatewayProcess]) -> None:
    first, second = replicas
    label = chat(first).headers["x-specgw-class"]
    for _ in range(5):
        chat(first)
    time.sleep(1.0)  # the first replica's deltas reach Redis (batched every 0.5 s)
    # One request makes the class live on the second replica; its statistics then
    # hold the first replica's evidence too, merged from Redis.
    assert chat(second).headers["x-specgw-class"] == label
    wait_for(lambda: int(classes(second).get(label, {}).get("samples", 0)) >= 7, 10)


def test_kill_switch_from_the_cli_reaches_both_replicas_within_2s(
    replicas: list[GatewayProcess],
) -> None:
    first, second = replicas
    cli(first, "flags", "set", "speculation-enabled", "false")
    try:
        for gw in (first, second):
            took = wait_for(lambda gw=gw: chat(gw).headers["x-specgw-k"] == "0", 2.0)
            assert took <= 2.0
        # And every request after that runs without drafts.
        body = chat(second).json()
        assert body["speculation"]["k"] == 0
        assert vllm_block(body)["num_draft_tokens"] == 0
    finally:
        cli(first, "flags", "unset", "speculation-enabled")
    wait_for(lambda: chat(second).headers["x-specgw-k"] != "0", 5.0)


def test_classes_command_prints_the_cluster_table(replicas: list[GatewayProcess]) -> None:
    label = chat(replicas[0]).headers["x-specgw-class"]
    assert label in cli(replicas[1], "classes")


def test_class_state_survives_a_replica_restart(
    replicas: list[GatewayProcess], third_replica: ProxiedReplica
) -> None:
    first, _ = replicas
    label = chat(first).headers["x-specgw-class"]
    wait_for(lambda: int(classes(first).get(label, {}).get("samples", 0)) >= 1, 5)
    before = int(classes(first)[label]["samples"])
    time.sleep(1.5)  # let the last deltas flush
    fresh = third_replica.start()  # a process started now, after the class's history
    chat(fresh)  # the class goes live here; its history comes from Redis
    wait_for(lambda: int(classes(fresh).get(label, {}).get("samples", 0)) > before, 10)


def test_redis_outage_fails_no_request(
    replicas: list[GatewayProcess], module_redis: RedisServer
) -> None:
    first, second = replicas
    module_redis.stop()
    try:
        for _ in range(4):
            for gw in (first, second):
                chat(gw)  # asserts 200
        with first.http(None) as http:
            detail = http.get("/ready").json()
        assert detail["ready"] is True
        wait_for(lambda: _redis_state(first) == "degraded", 10)
    finally:
        module_redis.start()
    wait_for(lambda: _redis_state(first) == "ok", 15)
    for gw in (first, second):
        chat(gw)


def _redis_state(gw: GatewayProcess) -> str:
    with gw.http(None) as http:
        return str(http.get("/ready").json()["detail"].get("redis"))


class ProxiedReplica:
    """A third replica that reaches Redis through a loopback proxy that can delay, started
    on first use: the restart test's fresh process, which the slow-Redis test then uses
    (at delay 0 the proxy only relays)."""

    def __init__(self, redis: RedisServer, tmp: Path) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.proxy = DelayProxy(redis.port)
        asyncio.run_coroutine_threadsafe(self.proxy.start(), self.loop).result(5)
        self.tmp = tmp
        self.gw: GatewayProcess | None = None

    def start(self) -> GatewayProcess:
        """Start it now (the restart test's fresh process: never one started before)."""
        assert self.gw is None, "the third replica is already running"
        env = {"SPECGW_REDIS_URL": self.proxy.url, "SPECGW_NAMESPACE": "cluster-test"}
        self.gw = start_gateway(self.tmp, {**env, **NO_CALIBRATION})
        return self.gw

    def get(self) -> GatewayProcess:
        return self.gw if self.gw is not None else self.start()

    def close(self) -> None:
        try:
            if self.gw is not None:
                stop_gateway(self.gw)
        finally:
            asyncio.run_coroutine_threadsafe(self.proxy.close(), self.loop).result(5)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)


@pytest.fixture(scope="module")
def third_replica(
    module_redis: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ProxiedReplica]:
    replica = ProxiedReplica(module_redis, tmp_path_factory.mktemp("third"))
    try:
        yield replica
    finally:
        replica.close()


@pytest.fixture
def slow_redis_replica(third_replica: ProxiedReplica) -> tuple[GatewayProcess, DelayProxy]:
    """The third replica, on Redis again after the outage test, its proxy at delay 0."""
    gw = third_replica.get()
    third_replica.proxy.delay_s = 0.0
    wait_for(lambda: _redis_state(gw) == "ok", 15)
    return gw, third_replica.proxy


def test_slow_redis_fails_no_request_and_state_converges(
    replicas: list[GatewayProcess], slow_redis_replica: tuple[GatewayProcess, DelayProxy]
) -> None:
    """Redis answering 0.5 s late: requests neither fail nor wait for it; once it is fast
    again, the slow replica's evidence reaches the cluster totals another replica sees."""
    first = replicas[0]
    slow, proxy = slow_redis_replica
    label = chat(first).headers["x-specgw-class"]
    time.sleep(1.0)  # that request's delta is in Redis
    before = int(classes(first).get(label, {}).get("samples", 0))
    proxy.delay_s = 0.5
    took = []
    for _ in range(6):
        started = time.monotonic()
        assert chat(slow).headers["x-specgw-class"] == label  # asserts 200
        took.append(time.monotonic() - started)
    # An 8-token answer; a request that waited on Redis would take >= 0.5 s per round trip.
    assert max(took) < 2.0, took
    with slow.http(None) as http:
        assert http.get("/ready").json()["ready"] is True
    proxy.delay_s = 0.0
    wait_for(lambda: int(classes(first).get(label, {}).get("samples", 0)) >= before + 6, 20)
