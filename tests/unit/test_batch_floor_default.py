"""The `batch-floor` flag's default follows the engine (`ControllerSettings.batch_floor`):
on where each request verifies its own depth, off where the engine verifies one depth per
step; a setting or a flags file overrides it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.control.settings import AUTO_BATCH_FLOOR, ControllerSettings
from tests.gateway.flag_files import write_flags
from tests.unit.conftest import QUICK_START, gateway_settings, serve_in_process

pytestmark = pytest.mark.asyncio(loop_scope="session")


def test_auto_is_on_only_where_each_request_verifies_its_own_depth() -> None:
    auto = ControllerSettings()
    assert auto.batch_floor == "auto"
    assert auto.batch_floor_for(one_depth_per_step=False) == AUTO_BATCH_FLOOR
    assert auto.batch_floor_for(one_depth_per_step=True) == 0.0
    for value in (0.0, 0.9):
        set_ = ControllerSettings(batch_floor=value)
        assert set_.batch_floor_for(False) == set_.batch_floor_for(True) == value


def test_a_floor_outside_a_share_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValidationError, match="batch_floor"):
        ControllerSettings(batch_floor=1.5)
    monkeypatch.setenv("SPECGW_CONTROL_BATCH_FLOOR", "0.5")
    assert ControllerSettings().batch_floor == 0.5
    monkeypatch.setenv("SPECGW_CONTROL_BATCH_FLOOR", "never")
    with pytest.raises(ValidationError):
        ControllerSettings()


async def _floor_gauge(**serve: object) -> str:
    async with serve_in_process(**serve) as gw:  # type: ignore[arg-type]
        metrics = (await gw.http.get("/metrics")).text
    line = next(
        x for x in metrics.splitlines() if x.startswith('specgw_flag_state{flag="batch-floor"}')
    )
    return line.split()[-1]


async def test_the_gateway_on_a_per_request_engine_defaults_the_floor_on() -> None:
    # The fake engine runs each request at its own depth, as vLLM's CPU engine does.
    assert float(await _floor_gauge()) == AUTO_BATCH_FLOOR


async def test_a_setting_or_a_flags_file_sets_the_floor(tmp_path: Path) -> None:
    off = QUICK_START.model_copy(update={"batch_floor": 0.0})
    assert float(await _floor_gauge(controller=off)) == 0.0
    write_flags(tmp_path, {"batch-floor": 0.5})
    assert float(await _floor_gauge(settings=gateway_settings(flags_dir=tmp_path))) == 0.5
