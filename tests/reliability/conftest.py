"""One real gateway process shared by the reliability tests that only need one.

Auth, malformed-body, input-limit and log tests all talk to the same
`spec-gateway serve` (real vLLM CPU engine), so a run pays for one engine start;
its log file is what the no-content-in-logs test reads at the end.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.gateway.conftest import NO_CALIBRATION, GatewayProcess, start_gateway, stop_gateway

#: Tests put this in any prompt whose text must never reach a log.
MARKER = "ZQXJV"


@pytest.fixture(scope="session")
def shared_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    gw = start_gateway(tmp_path_factory.mktemp("reliability-gw"), NO_CALIBRATION)
    yield gw
    stop_gateway(gw)
    log = gw.log_path.read_text(errors="replace")
    assert MARKER not in log, f"prompt text in {gw.log_path}"
