"""FlagView over real providers: a ConfigMap-style flags file and a real redis-server."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from gateway.control.controller import Controller
from gateway.control.decision import LoadSnapshot
from gateway.control.features import RequestFeatures
from gateway.control.plane import ControlPlane
from gateway.control.settings import ControllerSettings
from gateway.flags import FlagAdmin, FlagSettings, FlagValues, FlagView, Target
from gateway.flags.document import flags_document
from gateway.planner import FlagOverrides
from tests.clock import until
from tests.flags.configmap import flagd_document, static_flag, write_configmap
from tests.redis_fixtures import RedisServer

PIN_BY_CLASS_AND_LABEL = {
    "state": "ENABLED",
    "variants": {"none": -1, "zero": 0, "three": 3},
    "defaultVariant": "none",
    "targeting": {
        "if": [
            {"==": [{"var": "class"}, "c1"]},
            "zero",
            {"in": [{"var": "label"}, ["code", "math"]]},
            "three",
            None,
        ]
    },
}


def flag_settings(**overrides: Any) -> FlagSettings:
    base: dict[str, Any] = {
        "namespace": "t",
        "file_poll_interval_s": 0.1,
        "override_poll_interval_s": 0.5,
        "op_timeout_s": 0.3,
        "backoff_initial_s": 0.05,
        "backoff_max_s": 0.3,
    }
    return FlagSettings(**{**base, **overrides})


@asynccontextmanager
async def running_view(settings: FlagSettings) -> AsyncIterator[FlagView]:
    view = FlagView(settings)
    await view.start()
    try:
        yield view
    finally:
        await view.close()


async def test_defaults_without_any_source() -> None:
    async with running_view(flag_settings()) as view:
        assert view.overrides_for("c", "x") == FlagValues()
        assert view.redis_status is None


async def test_file_targeting_and_reload_on_configmap_swap(tmp_path: Path) -> None:
    flags_dir = tmp_path / "flags"
    write_configmap(
        flags_dir,
        {
            "flags.json": flagd_document(
                {"pin-k": PIN_BY_CLASS_AND_LABEL, "controller-mode": static_flag("shadow")}
            )
        },
    )
    changes: list[float] = []
    async with running_view(flag_settings(flags_dir=flags_dir)) as view:
        view.add_listener(lambda: changes.append(time.monotonic()))
        assert view.overrides_for("c1", "chat").pin_k == 0
        assert view.overrides_for("c2", "code").pin_k == 3
        other = view.overrides_for("c3", "chat")
        assert other.pin_k is None
        assert other.mode == "shadow"
        assert other.enabled is True  # not in the file: code default
        write_configmap(
            flags_dir,
            {
                "flags.json": flagd_document(
                    {"speculation-enabled": static_flag(False), "k-max": static_flag(4)}
                )
            },
        )
        took = await until(lambda: view.overrides_for("c3", "chat").enabled is False, 3.0)
        values = view.overrides_for("c1", "chat")
        assert (values.k_max, values.pin_k, values.mode) == (4, None, "adaptive")
        assert changes, "listeners are told of the change"
    assert took < 2.0


async def test_broken_or_missing_file_keeps_serving(tmp_path: Path) -> None:
    flags_dir = tmp_path / "flags"
    async with running_view(flag_settings(flags_dir=flags_dir)) as view:
        assert view.overrides_for("c", "") == FlagValues()  # no file yet: defaults
        write_configmap(flags_dir, {"flags.json": flagd_document({"k-min": static_flag(2)})})
        await until(lambda: view.overrides_for("c", "").k_min == 2, 3.0)
        errors = view.source_errors
        write_configmap(flags_dir, {"flags.json": "{not json"})
        await until(lambda: view.source_errors > errors, 3.0, "the broken file read")
        assert view.overrides_for("c", "").k_min == 2  # last good file stays in force
        write_configmap(flags_dir, {"flags.json": flagd_document({"k-min": static_flag(7)})})
        # A value out of its bounds falls back to the default for that flag only.
        write_configmap(
            flags_dir,
            {"flags.json": flagd_document({"k-min": static_flag(1), "k-max": static_flag(99)})},
        )
        await until(lambda: view.overrides_for("c", "").k_min == 1, 3.0)
        assert view.overrides_for("c", "").k_max == FlagValues().k_max


async def test_override_reaches_two_replicas_within_2s(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    flags_dir = tmp_path / "flags"
    write_configmap(flags_dir, {"flags.json": flagd_document({"pin-k": PIN_BY_CLASS_AND_LABEL})})
    settings = flag_settings(redis_url=redis_server.url, flags_dir=flags_dir)
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    admin = FlagAdmin(client, settings)
    async with running_view(settings) as a, running_view(settings) as b:
        assert a.redis_status == b.redis_status == "ok"
        assert a.overrides_for("c2", "code").pin_k == 3  # from the file
        t0 = time.monotonic()
        await admin.set("speculation-enabled", False, who="test")
        await until(lambda: not a.overrides_for("c9", "").enabled, 2.0)
        await until(lambda: not b.overrides_for("c9", "").enabled, 2.0)
        kill_s = time.monotonic() - t0
        # Per-class pins: class target beats label target beats global; Redis beats the file.
        await admin.set("pin-k", 5, who="test", target=Target.of(label="code"))
        await admin.set("pin-k", 0, who="test", target=Target.of(class_id="c2"))
        await until(lambda: b.overrides_for("c2", "code").pin_k == 0, 2.0)
        await until(lambda: b.overrides_for("c5", "code").pin_k == 5, 2.0)
        assert b.overrides_for("c1", "chat").pin_k == 0  # file rule for c1 still applies
        assert b.overrides_for("c6", "chat").pin_k is None
        await admin.unset("speculation-enabled", who="test")
        await until(lambda: a.overrides_for("c9", "").enabled and b.overrides_for("c9", "").enabled)
    await client.aclose()
    assert kill_s < 2.0, kill_s


async def test_poll_fallback_when_pubsub_message_is_lost(redis_server: RedisServer) -> None:
    settings = flag_settings(redis_url=redis_server.url)
    async with running_view(settings) as view:
        # Change the hash and version the way the admin does, but publish nothing.
        with redis_server.client() as raw:
            raw.hset("specgw:{t}:flags", "controller-mode", '"static"')
            raw.incr("specgw:{t}:flags:version")
        took = await until(lambda: view.overrides_for("c", "").mode == "static", 2.0)
    assert took < 2.0


async def test_redis_down_keeps_last_overrides_then_catches_up(redis_server: RedisServer) -> None:
    settings = flag_settings(redis_url=redis_server.url)
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    admin = FlagAdmin(client, settings)
    async with running_view(settings) as view:
        await admin.set("exploration-share", 0.2, who="test")
        await until(lambda: view.overrides_for("c", "").exploration_share == 0.2, 2.0)
        redis_server.stop()
        await until(lambda: view.redis_status == "degraded", 3.0)
        t0 = time.perf_counter()
        for _ in range(1000):
            assert view.overrides_for("c", "").exploration_share == 0.2
        assert time.perf_counter() - t0 < 0.05
        redis_server.start()
        await client.aclose()  # the admin's own connection died with the server
        client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        await FlagAdmin(client, settings).set("exploration-share", 0.3, who="test")
        await until(lambda: view.overrides_for("c", "").exploration_share == 0.3, 5.0)
        assert view.redis_status == "ok"
    await client.aclose()


async def test_hot_path_is_a_dict_lookup(redis_server: RedisServer, tmp_path: Path) -> None:
    flags_dir = tmp_path / "flags"
    write_configmap(flags_dir, {"flags.json": flagd_document({"pin-k": PIN_BY_CLASS_AND_LABEL})})
    settings = flag_settings(redis_url=redis_server.url, flags_dir=flags_dir)
    async with running_view(settings) as view:
        t0 = time.perf_counter()
        view.overrides_for("c2", "code")
        miss_s = time.perf_counter() - t0
        n = 100_000
        t0 = time.perf_counter()
        for _ in range(n):
            view.overrides_for("c2", "code")
        hit_s = (time.perf_counter() - t0) / n
    print(f"flag view: miss {miss_s * 1e6:.0f} us, hit {hit_s * 1e9:.0f} ns")
    assert hit_s < 5e-6


async def test_generated_document_states_the_defaults(tmp_path: Path) -> None:
    defaults = FlagValues(mode="static", pin_k=2, k_max=6, exploration_share=0.0)
    flags_dir = tmp_path / "flags"
    write_configmap(flags_dir, {"flags.json": json.dumps(flags_document(defaults))})
    async with running_view(flag_settings(flags_dir=flags_dir)) as view:
        # Read from the file (the view's own code defaults differ), not from the fallback.
        assert view.overrides_for("any", "") == defaults


async def test_controller_overrides_are_built_once_per_flag_state(tmp_path: Path) -> None:
    """`FlagOverrides` reuses one `ControlOverrides` per class until a flag changes."""
    flags_dir = tmp_path / "flags"
    write_configmap(flags_dir, {"flags.json": flagd_document({"pin-k": PIN_BY_CLASS_AND_LABEL})})
    async with running_view(flag_settings(flags_dir=flags_dir)) as view:
        overrides = FlagOverrides(view.overrides_for)
        first = overrides("c2", "code")
        assert first.pin_k == 3
        assert overrides("c2", "code") is first
        assert overrides("c1", "chat").pin_k == 0
        write_configmap(flags_dir, {"flags.json": flagd_document({"k-max": static_flag(2)})})
        await until(lambda: overrides("c2", "code").k_max == 2, 3.0)
        changed = overrides("c2", "code")
        assert changed is not first
        assert changed.pin_k is None


async def test_a_batch_floor_flag_reaches_the_plan_and_the_batch(tmp_path: Path) -> None:
    """`batch-floor` for one label travels flags -> overrides -> `Plan.floor`, and the
    batch files a request of that class under `guarded` while it is in flight."""
    features = RequestFeatures("chat", tools=True)
    label = Controller(ControllerSettings()).classify(features).label  # chat/tools/len:64
    floor_by_label = {
        "state": "ENABLED",
        "variants": {"off": 0.0, "strict": 0.98},
        "defaultVariant": "off",
        "targeting": {"if": [{"==": [{"var": "label"}, label]}, "strict", "off"]},
    }
    flags_dir = tmp_path / "flags"
    write_configmap(flags_dir, {"flags.json": flagd_document({"batch-floor": floor_by_label})})
    async with running_view(flag_settings(flags_dir=flags_dir)) as view:
        plane = ControlPlane(
            Controller(ControllerSettings()), overrides=FlagOverrides(view.overrides_for)
        )
        tool = plane.plan_features(features, 100, LoadSnapshot())
        chat = plane.plan_features(RequestFeatures("chat"), 100, LoadSnapshot())
    assert (tool.plan.floor, chat.plan.floor) == (0.98, 0.0)
    tool.enter()
    chat.enter()
    assert plane.batch.guarded == {(tool.plan.gains, 0.98): 1}
    tool.finish(None)
    assert plane.batch.guarded == {}


async def test_a_reload_that_read_an_older_version_keeps_the_newer_snapshot(
    redis_server: RedisServer,
) -> None:
    """Two reloads in flight (the follower's, woken by one write's notice, and an admin
    write's read-back after the next): the one that read the older version counter must
    not replace the newer snapshot when it finishes last."""
    from gateway.flags.redis_provider import RedisOverrideProvider

    settings = flag_settings(redis_url=redis_server.url)
    provider = RedisOverrideProvider(settings)
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    keys = provider.keys
    try:
        await client.hset(keys.hash, "speculation-enabled", json.dumps(False))
        await client.set(keys.version, 8)
        await provider.reload()
        await client.hdel(keys.hash, "speculation-enabled")
        await client.set(keys.version, 7)  # what a read that began before the write saw
        await provider.reload()
        assert provider._snapshot == {"speculation-enabled": False}
        await client.set(keys.version, 9)
        await provider.reload()
        assert provider._snapshot == {}
    finally:
        await client.aclose()
        await provider.close()
