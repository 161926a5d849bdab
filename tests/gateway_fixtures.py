"""The engine tier's shared `spec-gateway serve` processes, one per configuration that
many modules can use as it is; registered in the root conftest, so `tests/gateway`,
`tests/observability` and `tests/reliability` reach the same process.

A gateway start is three vLLM imports (the gateway, vLLM's EngineCore and its worker,
both spawned on the CPU platform) and a model load: most of the engine tier's time.
A module shares one of these unless its test needs settings of its own or a process it
may kill, drain or overload; a test on a shared process keys what it counts by its own
class, key or prompt, or reads deltas, since other modules' traffic came before.

Nothing here imports the gateway or vLLM at import time (the root conftest must not,
before `tests/cuda` picks its platform): the fixtures import what they start.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.gateway.conftest import GatewayProcess

#: Tests put this in any prompt whose text must never reach a log; the shared gateway's
#: log is checked for it when the session ends.
LOG_MARKER = "ZQXJV"


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """Calibrated at a few batch sizes (`SESSION_CALIBRATION`), for the tests that read the
    start-up calibration; the OpenAI surface's tests share it."""
    from tests.gateway.conftest import (
        CALIBRATE_BATCHES,
        SESSION_CALIBRATION,
        start_gateway,
        stop_gateway,
    )

    calibration = {CALIBRATE_BATCHES: json.dumps(SESSION_CALIBRATION)}
    gw = start_gateway(tmp_path_factory.mktemp("gw"), calibration)
    yield gw
    stop_gateway(gw)


@pytest.fixture(scope="session")
def shared_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    """No start-up calibration: the cost prior's depths, so short greedy replies speculate
    (a calibrated CPU host rightly runs them at k = 0). Auth, malformed bodies, input
    limits, logs and the live Prometheus scrape share it; no prompt text in its log."""
    from tests.gateway.conftest import NO_CALIBRATION, start_gateway, stop_gateway

    gw = start_gateway(tmp_path_factory.mktemp("shared-gw"), NO_CALIBRATION)
    yield gw
    stop_gateway(gw)
    log = gw.log_path.read_text(errors="replace")
    assert LOG_MARKER not in log, f"prompt text in {gw.log_path}"
