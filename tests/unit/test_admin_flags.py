"""Ops flags and the admin API on the in-process gateway, with a real redis-server.

Flags set through `PUT /admin/flags/{flag}` with the admin key reach the running
gateway through Redis (pub/sub), and the next request's `x-specgw-k` obeys them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from tests.clock import until_value
from tests.redis_fixtures import RedisServer
from tests.unit.conftest import (
    ADMIN_KEY,
    MESSAGES,
    MODEL,
    QUICK_START,
    USER_KEY,
    InProcessGateway,
    gateway_settings,
    serve_in_process,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


#: No probes: the tests compare a class's k before and after a flag change, and a probe
#: (k - 1 or k + 1 on a share of requests, drawn at random) would move it.
NO_PROBES = QUICK_START.model_copy(update={"exploration_share": 0.0})


@pytest_asyncio.fixture(loop_scope="session")
async def flagged(redis_server: RedisServer) -> AsyncIterator[InProcessGateway]:
    settings = gateway_settings(redis_url=redis_server.url)
    async with serve_in_process(settings, controller=NO_PROBES) as started:
        yield started


async def _chat_k(gw: InProcessGateway, content: str = "What does json do?") -> tuple[str, int]:
    raw = await gw.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0
    )
    return raw.headers["x-specgw-class"], int(raw.headers["x-specgw-k"])


async def _until_k(gw: InProcessGateway, want: int, content: str = "What does json do?") -> int:
    """The k of a chat request once the flag change has reached the gateway (5 s at most)."""

    async def k_now() -> int:
        return (await _chat_k(gw, content))[1]

    return await until_value(k_now, lambda k: k == want, 5.0, poll_s=0.05)


async def _effective_pin(gw: InProcessGateway) -> int | None:
    """The gateway's live `pin-k` once an unset has reached it (5 s at most)."""

    async def pin_now() -> int | None:
        listed = await gw.http.get("/admin/flags", headers=gw.auth(ADMIN_KEY))
        pin: int | None = listed.json()["effective"]["pin_k"]
        return pin

    return await until_value(pin_now, lambda pin: pin is None, 5.0, poll_s=0.05)


async def _flag(gw: InProcessGateway, method: str, flag: str, **body: Any) -> Any:
    headers = gw.auth(ADMIN_KEY)
    if method == "PUT":
        return await gw.http.put(f"/admin/flags/{flag}", json=body, headers=headers)
    return await gw.http.delete(f"/admin/flags/{flag}", params=body, headers=headers)


async def test_pin_k_set_and_unset(flagged: InProcessGateway) -> None:
    _, before = await _chat_k(flagged)
    pinned = 0 if before else 1
    answer = await _flag(flagged, "PUT", "pin-k", value=pinned)
    assert answer.status_code == 200, answer.text
    assert answer.json()["flag"] == "pin-k"
    assert await _until_k(flagged, pinned) == pinned
    listed = await flagged.http.get("/admin/flags", headers=flagged.auth(ADMIN_KEY))
    assert [o["flag"] for o in listed.json()["overrides"]] == ["pin-k"]
    assert listed.json()["effective"]["pin_k"] == pinned
    assert (await _flag(flagged, "DELETE", "pin-k")).status_code == 200
    assert await _effective_pin(flagged) is None  # the controller's k again
    audit = await flagged.http.get("/admin/flags/audit", headers=flagged.auth(ADMIN_KEY))
    assert [e["flag"] for e in audit.json()["data"]][:2] == ["pin-k", "pin-k"]


async def test_the_kill_switch_turns_speculation_off(flagged: InProcessGateway) -> None:
    assert (await _flag(flagged, "PUT", "speculation-enabled", value=False)).status_code == 200
    assert await _until_k(flagged, 0) == 0
    metrics = (await flagged.http.get("/metrics")).text
    assert 'specgw_flag_state{flag="speculation-enabled"} 0.0' in metrics


async def test_a_pin_for_one_label_leaves_the_others(flagged: InProcessGateway) -> None:
    label, k = await _chat_k(flagged)
    other = "Summarise: " + "the river runs to the sea " * 40  # a longer class
    other_label, other_k = await _chat_k(flagged, other)
    assert other_label != label
    pinned = min({0, 1, 2} - {k, other_k})  # neither class's own k
    answer = await _flag(flagged, "PUT", "pin-k", value=pinned, label=label)
    assert answer.status_code == 200, answer.text
    assert await _until_k(flagged, pinned) == pinned
    # Not `== other_k`: the class's own k may move with what its first request taught it
    # and the step times the cost model read (wall-clock, on a loaded host), not the pin.
    assert (await _chat_k(flagged, other))[1] != pinned


@pytest.mark.parametrize(("flag", "value"), [("pin-k", "four"), ("no-such-flag", 1), ("k-max", -3)])
async def test_bad_flags_and_values_are_400(
    flagged: InProcessGateway, flag: str, value: Any
) -> None:
    answer = await _flag(flagged, "PUT", flag, value=value)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["type"] == "invalid_request_error"


async def test_flags_need_the_admin_key(flagged: InProcessGateway) -> None:
    answer = await flagged.http.put(
        "/admin/flags/pin-k", json={"value": 1}, headers=flagged.auth(USER_KEY)
    )
    assert answer.status_code == 403


async def test_without_redis_flag_writes_are_503(gateway: InProcessGateway) -> None:
    answer = await _flag(gateway, "PUT", "pin-k", value=1)
    assert answer.status_code == 503
    assert answer.headers["retry-after"]


async def test_admin_classes_and_costs_after_traffic(gateway: InProcessGateway) -> None:
    client = gateway.client()
    for _ in range(3):
        await client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0
        )
    admin = gateway.auth(ADMIN_KEY)
    classes = (await gateway.http.get("/admin/classes", headers=admin)).json()
    (row,) = classes["data"]
    assert row["label"].startswith("chat/")
    costs = (await gateway.http.get("/admin/costs", headers=admin)).json()
    assert costs["object"] == "cost_model"
    assert costs["calibration"] == []  # QUICK_START: no start-up calibration
    reset = await gateway.http.post("/admin/prefix-cache/reset", headers=admin)
    assert reset.json() == {"object": "prefix_cache", "reset": True}
