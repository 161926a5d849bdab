"""The chaos soak in its short form (CI): 150 requests, every fault included.

The full form (`python -m tests.reliability.soak --requests 2000 --concurrency 32`)
runs the same code; see `soak.py` for what it does and checks.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.reliability.soak import SoakConfig, run_soak

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_short_chaos_soak_loses_nothing(tmp_path: Path) -> None:
    summary = asyncio.run(run_soak(SoakConfig(requests=150, concurrency=16, workdir=tmp_path)))
    print(json.dumps(summary, indent=2))
    assert summary["failures"] == []
    assert summary["ok"]
    assert summary["requests"] >= 150
    assert [f["fault"] for f in summary["faults"]] == [
        "engine core killed",
        "redis stopped and restarted",
        "replica SIGTERM and replaced",
    ]
    assert summary["states"].get("client_left", 0) > 0
    assert summary["slow_client_states"].get("complete", 0) > 0
    assert all(set(c) >= {"checkpoint"} for c in summary["checkpoints"])
