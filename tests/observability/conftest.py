"""Fixtures of the observability tests: a populated metrics catalogue, promtool, prometheus."""

from __future__ import annotations

import shutil

import pytest
from prometheus_client import CollectorRegistry

from engine.interface import RequestOutcome, SpeculationOutcome
from gateway.control.classify import OTHER, RequestClass
from gateway.engine_watch import EngineState
from gateway.observability.metrics import GatewayMetrics
from gateway.observability.replica_metrics import BuildInfo

FLAGS = ("speculation.enabled", "speculation.k_max")
#: A class as the classifier names it: a 16-hex id and the label a human reads.
CHAT = RequestClass("5f0c2a9e1b7d3c4a", "chat/len:512")


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    """The `prometheus` binary for tests/observability/prometheus_server.py; skips without."""
    path = shutil.which("prometheus")
    if path is None:
        pytest.skip("prometheus not installed (Debian package `prometheus`; make system-deps)")
    return path


def sample_outcome(k: int, steps: int, accepted_per_position: tuple[int, ...]) -> RequestOutcome:
    """A finished request as the engine reports it (vLLM per-request metrics)."""
    accepted = sum(accepted_per_position)
    return RequestOutcome(
        request_id=f"r-{k}-{steps}",
        prompt_tokens=40,
        output_tokens=steps + accepted if steps else 16,
        finish_reason="length",
        speculation=SpeculationOutcome(
            k=k,
            verify_steps=steps,
            draft_tokens=steps * k,
            accepted_tokens=accepted,
            accepted_per_position=accepted_per_position,
        ),
        ttft_s=0.08,
        tpot_s=0.012,
        e2e_s=0.5,
        decode_steps=steps,
    )


def populate(metrics: GatewayMetrics) -> None:
    """A fixed set of observations touching every family (for golden and promtool)."""
    metrics.record_depth(CHAT, 3)
    metrics.record_outcome(CHAT, sample_outcome(3, 10, (8, 5, 2)))
    metrics.record_request(CHAT, 200)
    metrics.record_admission(CHAT, 0.02)
    metrics.record_gateway_ttft(CHAT, 0.1)
    metrics.record_depth(OTHER, 0)
    metrics.record_outcome(OTHER, sample_outcome(0, 0, ()))
    metrics.record_request(OTHER, 429, "rate_limit_exceeded")
    metrics.record_decision_change(CHAT, 2, 3, "goodput +12% at k=3 over k=2")
    metrics.record_drift(CHAT, -1)
    metrics.record_drift_score(CHAT, 0.4)
    metrics.record_measured_positions(CHAT, 3)
    metrics.record_batch_lowered(OTHER)
    metrics.set_flags([("speculation.enabled", 1.0), ("speculation.k_max", 4.0)])
    metrics.set_redis_state("up")
    metrics.set_load(waiting=2, running=5)
    metrics.set_engine_state(EngineState.READY)
    metrics.set_build_info(BuildInfo("0.1.0", "specgw-default", "eagle3.1", "0.32.0", 4))
    metrics.record_engine_step(True, 2, decoded=True)
    metrics.record_engine_step(False, None, decoded=True)


@pytest.fixture
def metrics() -> GatewayMetrics:
    m = GatewayMetrics(CollectorRegistry(), max_depth=4, flags=FLAGS)
    populate(m)
    return m


@pytest.fixture(scope="session")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool not installed (Debian package `prometheus`; `make system-deps`)")
    return path
