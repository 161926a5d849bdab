"""Run every mode x arrival x repeat on identical traffic and keep every request's record.

Modes that share an engine configuration share one gateway process and are
switched through `flags.json`; before a static mode is timed, a probe request
checks that the gateway really applies its k (`x-specgw-k`), so a flag that did
not take effect shows up as an error in the results instead of a wrong number.

Repeats are interleaved: repeat 0 of every mode, then repeat 1 of every mode in the
reverse order, and so on (A B B A), every gateway process staying up (idle) between its
turns. Run mode by mode, a host whose speed drifts during the quarter hour of a whole
run (repeats of one mode can differ by 25 % on a shared host; `report.md` shows each
mode's spread) gives each mode its own stretch of that drift, a bias between modes that
no number of repeats removes; interleaved, the drift lands in every mode's spread
instead, and reversed every other repeat, a steady drift favours no mode's place in
the order.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import openai
from tqdm import tqdm

from bench.gateway_proc import (
    BENCH_ADMIN_KEY,
    BENCH_KEY,
    GatewayConfig,
    GatewayProcess,
    ModelPaths,
    start_gateway,
    write_flags,
)
from bench.modes import Mode
from bench.replay import RequestRecord, replay, send_one
from bench.workload import Arrival, ClosedLoop, WorkItem
from gateway.calibration import PER_REQUEST_BATCHES
from gateway.config.catalogue import env_names

#: The flags file is polled every 0.5 s by the gateway (FlagSettings.file_poll_interval_s).
FLAG_SETTLE_S = 1.5


@dataclass(frozen=True, slots=True)
class RunKey:
    mode: str
    arrival: str
    repeat: int


@dataclass
class RunResult:
    key: RunKey
    wall_s: float
    records: list[RequestRecord]
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.key.mode,
            "arrival": self.key.arrival,
            "repeat": self.key.repeat,
            "wall_s": self.wall_s,
            "notes": self.notes,
            "records": [r.to_json() for r in self.records],
        }


#: `ControllerSettings.calibrate_batches`, as the gateway reads it from its environment.
CALIBRATE_BATCHES_ENV = env_names(("control", "calibrate_batches"))[0]


@dataclass(frozen=True, slots=True)
class RunPlan:
    modes: list[Mode]
    arrivals: list[Arrival]
    repeats: int
    items: list[WorkItem]
    request_timeout_s: float = 300.0
    warmup: int = 8
    #: The start-up calibration's batch sizes where the run sets them (else `gateway_env`'s).
    calibrate_batches: list[int] | None = None

    def gateway_env(self) -> dict[str, str]:
        """Settings every gateway of the run gets: the calibration's batch sizes where the
        plan sets them; else, where every arrival is a closed loop, start-up calibration
        times only the batch sizes those loops reach (the default set,
        `PER_REQUEST_BATCHES`, up to the largest concurrency): larger batches add minutes
        to each speculative gateway's start on the CPU, for costs no run reads. An open
        loop's batch is unbounded, so it keeps the default set."""
        if self.calibrate_batches is not None:
            return {CALIBRATE_BATCHES_ENV: json.dumps(self.calibrate_batches)}
        if not self.arrivals or not all(isinstance(a, ClosedLoop) for a in self.arrivals):
            return {}
        top = max(a.concurrency for a in self.arrivals if isinstance(a, ClosedLoop))
        batches = [b for b in PER_REQUEST_BATCHES if b <= top]  # 1 <= top
        if batches == list(PER_REQUEST_BATCHES):
            return {}
        return {CALIBRATE_BATCHES_ENV: json.dumps(batches)}

    def warmup_items(self) -> list[WorkItem]:
        """The first `warmup` requests plus one of every family they lack.

        The warm-up takes an engine's first-step costs; it does not leave prompts in
        the prefix cache for the timed runs, which every mode starts with the cache
        emptied (`_run_mode`).
        """
        items = list(self.items[: self.warmup])
        seen = {item.family for item in items}
        for item in self.items:
            if item.family not in seen:
                seen.add(item.family)
                items.append(item)
        return items


def _client(gw: GatewayProcess, timeout_s: float) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{gw.base_url}/v1", api_key=BENCH_KEY, timeout=timeout_s, max_retries=0
    )


async def _probe_k(gw: GatewayProcess, mode: Mode, plan: RunPlan, tries: int) -> int | None:
    """The k the gateway reports for a probe request; stops early once it is the expected one."""
    client = _client(gw, plan.request_timeout_s)
    seen: int | None = None
    try:
        for _ in range(tries):
            rec = await send_one(client, plan.items[0], gw.model, time.perf_counter())
            seen = rec.k if rec.ok else None
            if seen == mode.expect_k:
                break
            await asyncio.sleep(1.0)
    finally:
        await client.close()
    return seen


async def _apply_flags(gw: GatewayProcess, mode: Mode, plan: RunPlan) -> int | None:
    """Write the mode's flags and wait for the file poll; the probed k for a static mode."""
    write_flags(gw.flags_dir, mode.flags)
    await asyncio.sleep(FLAG_SETTLE_S)
    if mode.expect_k is None:
        return None
    return await _probe_k(gw, mode, plan, tries=3)


#: The admin endpoints' credentials on every bench gateway.
ADMIN_AUTH = {"authorization": f"Bearer {BENCH_ADMIN_KEY}"}


async def _reset_prefix_cache(gw: GatewayProcess) -> bool:
    async with httpx.AsyncClient(base_url=gw.base_url, headers=ADMIN_AUTH, timeout=30) as client:
        answer = await client.post("/admin/prefix-cache/reset")
    return answer.status_code == 200 and bool(answer.json().get("reset"))


async def _run_repeat(
    gw: GatewayProcess,
    mode: Mode,
    plan: RunPlan,
    repeat: int,
    bar: tqdm[Any],
    sink: Callable[[RunResult], None],
    notes: list[str],
) -> None:
    if repeat == 0:
        # Untimed warm-up on this mode's settings (first-step costs, connection set-up).
        client = _client(gw, plan.request_timeout_s)
        try:
            await replay(client, plan.warmup_items(), ClosedLoop(4), gw.model)
        finally:
            await client.close()
        # Modes share an engine, so without this the first mode on an engine would pay
        # the cold prefills of the whole workload and the later ones find it cached (a
        # 1,337-token prompt: 1.9 s to its first token cold against 0.07 s cached on
        # CPU). k = 0 and k > 0 requests use separate cache namespaces
        # (`engine.vllm.scheduler`), so the mode that switches depths (adaptive) would pay
        # it again where a class first runs at the other. So each mode's first repeat
        # starts cold; later repeats find the workload cached (by the mode itself, or
        # by a mode sharing its process, which replays the same prompts).
        if not await _reset_prefix_cache(gw):
            notes.append(f"{mode.name}: the prefix cache was not reset before its runs")
    for arrival in plan.arrivals:
        bar.set_postfix_str(f"{mode.name} {arrival.label} r{repeat}")
        client = _client(gw, plan.request_timeout_s)
        try:
            records, wall = await replay(
                client, plan.items, arrival, gw.model, on_done=lambda _r: bar.update(1)
            )
        finally:
            await client.close()
        sink(RunResult(RunKey(mode.name, arrival.label, repeat), wall, records, notes))


class _Gateways:
    """One gateway process per configuration, started on first use and kept up (idle
    while other modes run: only one replays at a time) until the run ends."""

    def __init__(
        self, models: ModelPaths, workdir: Path, env: dict[str, str] | None = None
    ) -> None:
        self.models, self.workdir = models, workdir
        #: Set for every configuration; a configuration's own `env` wins.
        self.env = env or {}
        #: By configuration name (names are unique: a restart with k fixed renames).
        self.running: dict[str, tuple[GatewayConfig, GatewayProcess]] = {}

    def get(self, config: GatewayConfig) -> GatewayProcess:
        known = self.running.get(config.name)
        if known is not None and known[0] == config:
            return known[1]
        if known is not None:
            known[1].stop()
        started = replace(config, env={**self.env, **config.env})
        gw = start_gateway(started, self.models, self.workdir)
        self.running[config.name] = (config, gw)
        return gw

    def close(self) -> None:
        for _, gw in self.running.values():
            gw.stop()
        self.running.clear()


def _prepare(gateways: _Gateways, mode: Mode, plan: RunPlan) -> tuple[GatewayProcess, list[str]]:
    """A gateway applying this mode: flags on the shared process, else a restart with k fixed.

    Falls back to `--default-k` when the flags did not reach the k the gateway reports
    (a gateway without the controller / flags wired); said so in the run's notes.
    """
    gw = gateways.get(mode.gateway)
    seen = asyncio.run(_apply_flags(gw, mode, plan))
    if mode.expect_k is None or seen == mode.expect_k:
        return gw, []
    fixed = replace(mode.gateway, name=f"{mode.gateway.name}-k{mode.expect_k}")
    fixed = replace(fixed, default_k=mode.expect_k)
    gw = gateways.get(fixed)
    seen = asyncio.run(_probe_k(gw, mode, plan, tries=1))
    note = f"{mode.name}: flags not applied (k={seen}); gateway restarted with --default-k"
    if seen != mode.expect_k:
        note = f"{mode.name}: expected k={mode.expect_k}, gateway reports k={seen}"
    return gw, [note]


def repeat_order(modes: list[Mode], repeat: int) -> list[Mode]:
    """The modes in the plan's order on even repeats, reversed on odd ones (A B B A)."""
    return list(modes) if repeat % 2 == 0 else list(modes)[::-1]


def run_all(
    plan: RunPlan, models: ModelPaths, workdir: Path, sink: Callable[[RunResult], None]
) -> list[str]:
    """Run the plan, repeats interleaved across modes (module docstring); returns notes on
    modes that could not run as asked."""
    notes: list[str] = []
    per_repeat = len(plan.arrivals) * len(plan.items)
    gateways = _Gateways(models, workdir, plan.gateway_env())
    failed: set[str] = set()
    mode_notes: dict[str, list[str]] = {}
    try:
        with tqdm(
            total=len(plan.modes) * plan.repeats * per_repeat, unit="req", desc="bench"
        ) as bar:
            for repeat in range(plan.repeats):
                for mode in repeat_order(plan.modes, repeat):
                    if mode.name in failed:
                        bar.update(per_repeat)
                        continue
                    bar.set_postfix_str(f"preparing {mode.name}")
                    try:
                        gw, prepared = _prepare(gateways, mode, plan)
                    except RuntimeError as exc:
                        notes.append(f"{mode.name}: gateway did not start: {str(exc)[-600:]}")
                        failed.add(mode.name)
                        bar.update(per_repeat)
                        continue
                    run_notes = mode_notes.setdefault(mode.name, [])
                    run_notes += [n for n in prepared if n not in run_notes]
                    asyncio.run(_run_repeat(gw, mode, plan, repeat, bar, sink, run_notes))
        save_cost_models(gateways, workdir)
    finally:
        gateways.close()
    for run_notes in mode_notes.values():
        notes += run_notes
    return notes


COST_MODEL_GLOB = "costs-*.json"


def save_cost_models(gateways: _Gateways, workdir: Path) -> None:
    """Each speculative gateway's cost model as the run left it (`/admin/costs`), saved as
    `costs-<configuration>.json`: the report sets it beside the step costs the static
    modes measured, which is how a run shows the controller pricing depths wrong."""
    for name, (config, gw) in gateways.running.items():
        if not config.drafter:
            continue
        try:
            answer = httpx.get(f"{gw.base_url}/admin/costs", headers=ADMIN_AUTH, timeout=10)
        except httpx.HTTPError:
            continue
        if answer.status_code == 200:
            (workdir / f"costs-{name}.json").write_text(answer.text)


def load_cost_models(workdir: Path) -> dict[str, list[dict[str, Any]]]:
    """Configuration name -> its cost model's buckets, from `save_cost_models`' files."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(workdir.glob(COST_MODEL_GLOB)):
        body = json.loads(path.read_text())
        out[path.stem.removeprefix("costs-")] = list(body.get("buckets") or [])
    return out


class JsonlSink:
    """Appends each run to `runs.jsonl` as it finishes, so a crash keeps what was measured."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.results: list[RunResult] = []

    def __call__(self, result: RunResult) -> None:
        self.results.append(result)
        with self.path.open("a") as f:
            f.write(json.dumps(result.to_json()) + "\n")


def load_runs(path: Path) -> list[RunResult]:
    """Read back `runs.jsonl` (one run per line) as written by `JsonlSink`."""
    runs: list[RunResult] = []
    if not path.exists():
        return runs
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        raw = json.loads(line)
        records = [RequestRecord(**r) for r in raw["records"]]
        key = RunKey(raw["mode"], raw["arrival"], int(raw["repeat"]))
        runs.append(RunResult(key, float(raw["wall_s"]), records, list(raw["notes"])))
    return runs
