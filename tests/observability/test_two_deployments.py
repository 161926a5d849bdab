"""Two gateways with different `namespace` and `job` labels in one real Prometheus: every
dashboard query, filtered by its variables for one of them, returns series of that one
only, and the two together are the sum of each.

The gateways are the whole app on the fake backend (`engine.fake_backend`), served by
uvicorn on loopback ports in this process, with different drafters (so the drift
dashboard's drafter panel has two); the `vllm:*` series of the vLLM dashboard are a
replay of a real gateway's (`tests/observability/recorded.py`), which both export.
Needs the `prometheus` binary (Debian package `prometheus`); no engine.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from prometheus_client import REGISTRY

from engine.settings import EngineSettings
from gateway.app import create_app
from gateway.runtime import runtime_factory
from tests.gateway.conftest import free_port
from tests.observability.prometheus_server import running_prometheus, until
from tests.observability.recorded import RecordedVllmSeries
from tests.unit.conftest import MODEL, QUICK_START, USER_KEY, gateway_settings
from tools.dashboards.build import concrete, dashboard_expressions
from tools.dashboards.drift_dashboard import ACCEPTANCE_LENGTH

pytestmark = pytest.mark.timeout(300)

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "engine" / "default_model"


@dataclass(frozen=True)
class Deployment:
    namespace: str
    job: str
    drafter: str
    requests: int
    port: int = 0

    @property
    def instance(self) -> str:
        return f"127.0.0.1:{self.port}"

    def scope(self) -> dict[str, str]:
        return {"namespace": self.namespace, "job": self.job, "instance": self.instance}


def serve(deployment: Deployment) -> Callable[[], None]:
    """The app on the fake backend, served by uvicorn in a thread; returns its stopper."""
    engine = EngineSettings(backend="fake", drafter=DEFAULT_MODEL / deployment.drafter)
    app = create_app(gateway_settings(), runtime_factory(engine, QUICK_START))
    config = uvicorn.Config(app, host="127.0.0.1", port=deployment.port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "gateway did not start"
        time.sleep(0.05)

    def stop() -> None:
        server.should_exit = True
        thread.join(30)

    return stop


def load(deployment: Deployment, share: float) -> None:
    """`share` of the deployment's requests: three classes, streams, a completion and one
    client error (each kind in every share, so every series grows between scrapes)."""
    headers = {"authorization": f"Bearer {USER_KEY}"}
    base = f"http://{deployment.instance}"
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        for i in range(round(deployment.requests * share)):
            system = ("You are terse.", "You write Python.", "You answer in JSON.")[i % 3]
            body: dict[str, Any] = {
                "model": MODEL,
                "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": "hi"},
                ],
                "max_tokens": 16,
                "temperature": 0,
                "stream": i % 2 == 0,
            }
            assert http.post("/v1/chat/completions", json=body).status_code == 200
        completion = {"model": MODEL, "prompt": "Count to five:", "max_tokens": 8}
        assert http.post("/v1/completions", json=completion).status_code == 200
        assert http.post("/v1/chat/completions", json={"model": MODEL}).status_code == 400


@pytest.fixture(scope="module")
def deployments() -> Iterator[tuple[Deployment, Deployment]]:
    replay = RecordedVllmSeries()
    REGISTRY.register(replay)  # vLLM registers there too; the app's /metrics appends it
    a = Deployment("team-a", "specgw-a", "eagle3", requests=6, port=free_port())
    b = Deployment("team-b", "specgw-b", "eagle3.1", requests=12, port=free_port())
    stoppers = [serve(a), serve(b)]
    try:
        yield a, b
    finally:
        for stop in stoppers:
            stop()
        REGISTRY.unregister(replay)


@pytest.fixture(scope="module")
def prometheus(
    prometheus_binary: str,
    deployments: tuple[Deployment, Deployment],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("prometheus-two")
    jobs = [
        {
            "job_name": d.job,
            "static_configs": [{"targets": [d.instance], "labels": {"namespace": d.namespace}}],
        }
        for d in deployments
    ]
    config = {"global": {"scrape_interval": "1s"}, "scrape_configs": jobs}
    with running_prometheus(prometheus_binary, tmp, config) as base:
        until(lambda: len(series(base, "up == 1")) == 2, 30)
        # A series' first sample is where its rate starts: load in two parts, scrapes
        # between them and after, so every counter grows between two samples.
        for share in (1 / 3, 2 / 3):
            for d in deployments:
                load(d, share)
            time.sleep(3)
        time.sleep(3)
        yield base


def series(base: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params: dict[str, Any] = {"query": expr} if at is None else {"query": expr, "time": at}
    reply = httpx.get(f"{base}/api/v1/query", params=params, timeout=30).json()
    assert reply["status"] == "success", (expr, reply)
    result: list[dict[str, Any]] = reply["data"]["result"]
    return result


def evaluate(base: str, expr: str, at: float | None = None, **scope: str) -> list[dict[str, Any]]:
    return series(base, concrete(expr, rate_interval="1m", time_range="1m", **scope), at)


def evaluate_scraped(base: str, expr: str, **scope: str) -> list[dict[str, Any]]:
    """`evaluate`, polled for up to 10 s while it is empty: on a loaded host a gateway's
    answer to one 1 s scrape can arrive after the fixture's last wait (seen in CI once for
    one gauge of one deployment); a series that never arrives still fails."""
    deadline = time.monotonic() + 10
    while not (result := evaluate(base, expr, **scope)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return result


def test_every_dashboard_query_returns_series_of_the_selected_deployment_only(
    prometheus: str, deployments: tuple[Deployment, Deployment]
) -> None:
    failures = []
    expressions = [e for e in dashboard_expressions() if not e.may_be_empty]
    assert len(expressions) >= 40
    for deployment in deployments:
        scope = deployment.scope()
        for e in expressions:
            result = evaluate_scraped(prometheus, e.expr, **scope)
            if not result:
                failures.append(f"{deployment.job}: {e.source}: no series")
            for s in result:
                labels = s["metric"]
                for name, value in scope.items():
                    if labels.get(name, value) != value:
                        failures.append(f"{deployment.job}: {e.source}: {name}={labels[name]}")
    assert failures == [], "\n".join(failures)


def test_all_is_the_sum_of_the_two(
    prometheus: str, deployments: tuple[Deployment, Deployment]
) -> None:
    (panel,) = [e for e in dashboard_expressions() if e.source.endswith("Requests/s by status")]
    at = time.time() - 1  # one instant for the three

    def total(**scope: str) -> float:
        return sum(float(s["value"][1]) for s in evaluate(prometheus, panel.expr, at, **scope))

    a, b = (total(**d.scope()) for d in deployments)
    both = total()
    assert both == pytest.approx(a + b)
    assert b > a > 0  # b had twice the requests


def test_acceptance_by_class_keeps_the_two_drafters_apart(
    prometheus: str, deployments: tuple[Deployment, Deployment]
) -> None:
    (panel,) = [e for e in dashboard_expressions() if "by drafter and class" in e.source]
    drafters = {s["metric"]["drafter"] for s in evaluate(prometheus, panel.expr)}
    assert drafters == {d.drafter for d in deployments}
    for d in deployments:
        only = {s["metric"]["drafter"] for s in evaluate(prometheus, panel.expr, **d.scope())}
        assert only == {d.drafter}
    assert evaluate(prometheus, ACCEPTANCE_LENGTH, **deployments[0].scope())
