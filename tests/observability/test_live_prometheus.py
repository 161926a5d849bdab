"""A real Prometheus scrapes a live gateway under a short mixed load; every PromQL
expression of every dashboard panel and every rule is evaluated and must succeed, and
return series unless it is an alert condition or an event counter.

Needs the `prometheus` binary (Debian package) and a real vLLM engine.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.gateway.conftest import GatewayProcess
from tests.observability.prometheus_server import running_prometheus, until
from tools.dashboards.build import RULE_FILES, concrete, shipped_expressions

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def live_gateway(prometheus_binary: str, shared_gateway: GatewayProcess) -> GatewayProcess:
    # The session's uncalibrated gateway (tests/gateway_fixtures.py): the acceptance panels
    # and rules need speculating traffic, and on a CPU the calibrated policy (first-token
    # price, step costs) rightly runs 24-token replies at k = 0; from the cost prior it
    # speculates. Other modules' traffic before this one only adds series; the scrapes
    # start with this module's Prometheus, so rates are this module's load.
    return shared_gateway


@pytest.fixture(scope="module")
def prometheus(
    prometheus_binary: str, live_gateway: GatewayProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("prometheus")
    rules = []
    for path in RULE_FILES:  # same rules, evaluated every second for a short test
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            group["interval"] = "1s"
        rules.append(tmp / path.name)
        rules[-1].write_text(yaml.safe_dump(doc))
    target = live_gateway.base_url.removeprefix("http://")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [{"job_name": "specgw", "static_configs": [{"targets": [target]}]}],
    }
    with running_prometheus(prometheus_binary, tmp, config) as base:
        yield base


def mixed_load(gw: GatewayProcess) -> None:
    """Several classes (system prompts, JSON mode, completions), streams, and errors."""
    with gw.http() as http:
        model = http.get("/v1/models").json()["data"][0]["id"]

    def chat(i: int) -> int:
        system = ("You are terse.", "You write Python.", "You answer in JSON.")[i % 3]
        body: dict[str, object] = {
            "model": model,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hi"}],
            "max_tokens": 24,
            "stream": i % 2 == 0,
            # Greedy: the acceptance panels need classes that accept many drafts.
            "temperature": 0,
        }
        if i % 3 == 2:
            body["response_format"] = {"type": "json_object"}
        with gw.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as r:
            r.read()  # a stream ends with [DONE]; reading it all lets the request finish
            return r.status_code

    def completion(i: int) -> int:
        body = {"model": model, "prompt": f"Count to {i}:", "max_tokens": 24, "temperature": 0}
        with gw.http() as http:
            return http.post("/v1/completions", json=body).status_code

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(chat, i) for i in range(18)]
        jobs += [pool.submit(completion, i) for i in range(6)]
        statuses = [job.result() for job in jobs]
    assert statuses.count(200) >= 20, statuses
    with gw.http() as http:  # one client error for the error panels
        assert http.post("/v1/chat/completions", json={"model": model}).status_code == 400


def query(base: str, expr: str) -> dict[str, object]:
    response = httpx.get(f"{base}/api/v1/query", params={"query": expr}, timeout=30)
    return dict(response.json())


def test_every_shipped_expression_evaluates_on_live_data(
    live_gateway: GatewayProcess, prometheus: str
) -> None:
    until(lambda: query(prometheus, 'up{job="specgw"} == 1')["data"]["result"], 30)  # type: ignore[index]
    mixed_load(live_gateway)
    time.sleep(8)  # several scrapes and rule evaluations after the load
    failures = []
    for e in shipped_expressions():
        result = query(prometheus, concrete(e.expr, rate_interval="1m"))
        if result.get("status") != "success":
            failures.append(f"{e.source}: error {result.get('error')}")
        elif not e.may_be_empty and not result["data"]["result"]:  # type: ignore[index]
            failures.append(f"{e.source}: no series")
    if failures:
        metrics = httpx.get(f"{live_gateway.base_url}/metrics", timeout=10).text
        specgw = [line for line in metrics.splitlines() if line.startswith("specgw_")]
        print("\n".join(specgw[:80]))
    assert failures == [], "\n".join(failures)


def test_gateway_and_vllm_acceptance_agree_on_live_data(
    live_gateway: GatewayProcess, prometheus: str
) -> None:
    gateway = query(prometheus, "sum(specgw_verify_steps_total)")["data"]["result"]  # type: ignore[index]
    engine = query(prometheus, "sum(vllm:spec_decode_num_drafts_total)")["data"]["result"]  # type: ignore[index]
    assert gateway
    assert engine
    # The engine's warm-up requests do not pass through the gateway: engine >= gateway.
    assert float(engine[0]["value"][1]) >= float(gateway[0]["value"][1]) > 0


def test_live_metrics_have_no_created_series_and_one_info_series_per_class(
    live_gateway: GatewayProcess,
) -> None:
    """The real gateway's `/metrics`, vLLM's families included: no `_created` series, and
    every class id with series has exactly one `specgw_class_info`."""
    with live_gateway.http() as http:
        model = http.get("/v1/models").json()["data"][0]["id"]
        chat = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        assert http.post("/v1/chat/completions", json=chat).status_code == 200
        body = http.get("/metrics").text
    samples = [s for f in text_string_to_metric_families(body) for s in f.samples]
    assert any(s.name.startswith("vllm:") for s in samples)
    assert [s.name for s in samples if s.name.endswith("_created")] == []
    info = [s.labels["class_id"] for s in samples if s.name == "specgw_class_info"]
    ids = {s.labels["class_id"] for s in samples if "class_id" in s.labels}
    assert ids
    assert sorted(info) == sorted(ids), (info, ids)
