"""The in-process transport bounds each exchange and names what the app was waiting on."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI

from tests.unit import conftest
from tests.unit.conftest import BoundedASGITransport


def never_answering_app() -> FastAPI:
    app = FastAPI()
    stuck = asyncio.Event()

    @app.get("/stuck")
    async def wait_forever() -> dict[str, str]:
        await stuck.wait()
        return {}

    @app.get("/ok")
    async def ok() -> dict[str, str]:
        return {"ok": "yes"}

    return app


async def test_a_hung_exchange_times_out_with_the_apps_pending_frames(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(conftest, "EXCHANGE_TIMEOUT_S", 0.2)
    transport = BoundedASGITransport(never_answering_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        assert (await http.get("/ok")).json() == {"ok": "yes"}
        assert transport.hangs == []
        with pytest.raises(httpx.ReadTimeout):
            await http.get("/stuck")
    [hang] = transport.hangs
    assert hang.startswith("GET http://t/stuck unanswered in 0.2 s")
    assert "wait_forever" in hang  # the handler's frame, where it waits
