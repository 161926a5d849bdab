"""`spec-gateway serve` as an operator starts it (fake backend, no model): the `OTEL_*`
environment reaches the exporter, `OTEL_SERVICE_NAME` names the service, and the log
lines on stderr carry the request id and the trace id of the exported spans.

A real process (about 30 s to start: the vLLM import), so it sits in the engine tier and
one request covers it all; a value the gateway cannot honour stops the CLI (in process,
unit tier) with the variable's name and no traceback.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from gateway.cli import app
from tests.gateway.conftest import NO_CALIBRATION
from tests.observability.otlp_receiver import running
from tests.observability.test_genai_export import OTEL_VARIABLES, fields

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OTEL_VARIABLES}
    env = {k: v for k, v in env.items() if not k.startswith("SPECGW_")}
    env.update(extra)
    return env


@pytest.mark.engine  # a gateway process: the engine tier's (tests/tier_guard.py), no model
def test_serve_exports_as_the_named_service_and_logs_the_ids(tmp_path: Path) -> None:
    port = free_port()
    stderr_file = tmp_path / "gateway.log"
    with running() as receiver:
        env = clean_env(
            OTEL_EXPORTER_OTLP_ENDPOINT=receiver.base_url,
            OTEL_SERVICE_NAME="gw-cli",
            **NO_CALIBRATION,  # ready without the start-up calibration
        )
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--backend", "fake"]
        with stderr_file.open("wb") as log:
            proc = subprocess.Popen(
                [*cmd, "--port", str(port)], cwd=REPO, env=env, stdout=log, stderr=log
            )
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 180
            while True:
                assert proc.poll() is None, stderr_file.read_text()[-3000:]
                assert time.monotonic() < deadline, stderr_file.read_text()[-3000:]
                try:
                    if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            body = {"model": "specgw-default", "prompt": "hello", "max_tokens": 3}
            headers = {"x-request-id": "cli-req-1"}
            r = httpx.post(f"{base}/v1/completions", json=body, headers=headers, timeout=30)
            assert r.status_code == 200, r.text
        finally:
            proc.terminate()  # the drain, then the lifespan's exit flushes the exporter
            proc.wait(60)
        spans = receiver.wait_for(lambda got: len(got) >= 2)
    assert {s.resource["service.name"] for s in spans} == {"gw-cli"}
    (inference,) = [s for s in spans if s.kind == "INTERNAL"]
    assert inference.name == "text_completion specgw-default"
    assert inference.attributes["gen_ai.response.id"] == r.json()["id"]
    lines = stderr_file.read_text().splitlines()
    assert any("tracing to" in ln and "as service gw-cli" in ln for ln in lines)
    (line,) = [ln for ln in lines if "request finished" in ln]
    assert fields(line)["request_id"] == "cli-req-1"
    assert fields(line)["trace_id"] == inference.trace_id


def test_serve_refuses_an_otel_value_it_cannot_honour(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in OTEL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    result = CliRunner().invoke(app, ["serve", "--backend", "fake", "--port", "0"])
    assert result.exit_code != 0
    assert "OTEL_EXPORTER_OTLP_PROTOCOL='http/json'" in result.output
