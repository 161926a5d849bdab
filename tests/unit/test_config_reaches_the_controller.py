"""Controller settings from the YAML file reach the running controller, seen through the
admin API, on the app `spec-gateway serve` builds (`gateway.cli.build_app`) on the fake
backend, in process."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.auth import digest
from gateway.cli import build_app
from gateway.config import resolve
from gateway.control.settings import ControllerSettings
from tests.clock import until_value
from tests.unit.conftest import (
    ADMIN_KEY,
    BASE_URL,
    MESSAGES,
    MODEL,
    USER_KEY,
    InProcessGateway,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_a_controller_setting_from_yaml_reaches_the_admin_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("SPECGW_")]:
        monkeypatch.delenv(name)
    config = tmp_path / "gateway.yaml"
    control: dict[str, Any] = {"default_k": 1, "exploration_share": 0.0}
    control |= {"calibrate_batches": [1, 2], "calibrate_tokens": 8}
    # A cold class steps down at once where its prior pays more at a smaller k at the
    # measured costs, and the calibration's wall-clock step times on a loaded host can
    # price k = 1 above k = 0: a cheap draft, weighted far above the measurements, keeps
    # the first request at `default_k`.
    control |= {"prior_k_cost": 0.02, "cost_prior_weight": 1e6}
    tree = {
        "api_keys": [digest(USER_KEY)],
        "admin_keys": [digest(ADMIN_KEY)],
        "engine": {"backend": "fake", "max_depth": 4},
        "control": control,
    }
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    defaults = ControllerSettings()
    assert (defaults.default_k, defaults.calibrate_batches) == (3, None)

    app = build_app(resolve(config_file=config))
    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE_URL) as http,
    ):
        costs = (await http.get("/admin/costs", headers=admin)).json()
        assert {p["batch"] for p in costs["calibration"]} == {1, 2}
        chat = InProcessGateway(app, http).client(USER_KEY).chat.completions.with_raw_response
        reply = await chat.create(model=MODEL, messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
        assert reply.headers["x-specgw-k"] == "1"  # a new class starts at control.default_k

        # The outcome is filed as the answer ends, on the event loop: poll, bounded only
        # against a hang. The class's k after it is not compared: the policy reads it off
        # the start-up calibration's wall-clock step times, which a loaded host skews
        # (k = 1 measured dearer than it pays, and the class moves to 0).
        async def class_row() -> dict[str, Any]:
            listed = await http.get("/admin/classes", headers=admin)
            rows: list[dict[str, Any]] = listed.json()["data"]
            (row,) = rows
            return row

        row = await until_value(class_row, lambda row: bool(row["samples"]), 30.0)
        assert row["samples"] == 1
