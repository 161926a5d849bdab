"""The pure parts of `bench.floor_interleaved` and `bench.floor_summary`: burst plans, the
variants and their engines, the seeded order, per-request pairing, the burst bootstrap, the
summary rows and the timer table of a profiled run; the process CPU reading of
`bench.engines`; `bench.stats`' intervals. No engine starts."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from bench.engines import cpu_seconds
from bench.floor_interleaved import (
    SPEC,
    burst_plans,
    engine_extras,
    from_results,
    parse_variant,
    report,
    turn_order,
    variants,
)
from bench.floor_summary import (
    BASE,
    NULL,
    PROFILED,
    BurstRun,
    by_family,
    family_table,
    median_ratio,
    paired_ratios,
    plot,
    summarise,
    table,
)
from bench.gateway_proc import descendants
from bench.stats import bootstrap_interval, median_interval
from tests.clock import until_sync


def _run(scale: float, n: int, rng: random.Random | None = None) -> BurstRun:
    """A burst of n requests (the last one the joiner) whose figures are `scale` times a
    fixed per-request baseline, times a little noise when `rng` is given."""
    noise = (lambda: rng.lognormvariate(0.0, 0.05)) if rng else (lambda: 1.0)
    run = BurstRun()
    for i in range(n):
        joined = i == n - 1
        ttft = scale * (0.02 + 0.001 * i) * noise()
        run.ttft_start.append(None if joined else ttft)
        run.ttft_join.append(ttft if joined else None)
        run.tpot.append(scale * (0.005 + 0.0001 * i) * noise())
    run.cpu_per_token.append(scale * 0.01 * noise())
    return run


def test_every_variant_of_a_burst_runs_the_same_prompts_and_lengths() -> None:
    plans = burst_plans(4, 3, 48, seed=4)
    assert len(plans) == 3
    assert all(len(p.texts) == 4 == len(p.lengths) for p in plans)
    assert plans == burst_plans(4, 3, 48, seed=4)  # seeded: the same for every variant
    assert all(24 <= n <= 72 for p in plans for n in p.lengths)
    assert len({t for p in plans for t in p.texts}) > 1  # the bursts differ from each other


def test_past_the_pools_end_prompts_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    import bench.floor_interleaved as floor

    pool = [("x", "a"), ("y", "b"), ("z", "c")]
    monkeypatch.setattr(floor, "family_prompts", lambda count: pool[:count])
    plans = burst_plans(2, 3, 8, seed=0)
    assert [p.texts for p in plans] == [("a", "b"), ("c", "a"), ("b", "c")]
    assert [p.families for p in plans] == [("x", "y"), ("z", "x"), ("y", "z")]


def test_ratios_pair_each_request_with_the_same_request_of_the_base_run() -> None:
    assert paired_ratios([2.0, None, 4.0], [3.0, None, 2.0]) == [1.5, 0.5]
    assert paired_ratios([0.0, 1.0], [1.0, 0.0]) == []  # no figure (no second token): skipped
    assert median_ratio([[1.0, 3.0], [2.0]]) == 2.0  # pooled over the bursts' requests


def test_a_drift_between_bursts_cancels_and_a_real_cost_shows() -> None:
    rng = random.Random(3)
    runs: dict[tuple[int, str], list[BurstRun]] = {(4, n): [] for n in (BASE, NULL, "k = 0")}
    for b in range(30):
        drift = 1.0 + 0.25 * (b % 5) / 4  # the host: up to 25 % between bursts
        runs[(4, BASE)].append(_run(drift, 4, rng))
        runs[(4, NULL)].append(_run(drift, 4, rng))
        runs[(4, "k = 0")].append(_run(1.05 * drift, 4, rng))
    rows = {r["variant"]: r for r in summarise(runs, [4], [BASE, NULL, "k = 0"])}
    null, k0 = rows[NULL], rows["k = 0"]
    assert null["tpot"]["ci95"][0] < 1.0 < null["tpot"]["ci95"][1]
    assert k0["tpot"]["ci95"][0] > 1.0
    assert k0["tpot"]["ratio"] == pytest.approx(1.05, abs=0.02)
    assert k0["tpot"]["n"] == 120
    assert k0["ttft_start"]["n"] == 90
    assert k0["ttft_join"]["n"] == 30
    assert k0["cpu_per_token"]["n"] == 30
    lines = table(list(rows.values()))
    assert any(line.startswith("| 4 | k = 0 | 30 |") for line in lines)


def test_alone_a_request_has_no_starters_ttft() -> None:
    runs = {(1, n): [_run(1.0, 1), _run(1.0, 1)] for n in (BASE, "k = 0")}
    (row,) = summarise(runs, [1], [BASE, "k = 0"])
    assert "ttft_start" not in row
    assert row["ttft_join"]["ratio"] == 1.0
    assert "| - |" in table([row])[-1]


def test_the_bootstrap_resamples_whole_items_and_is_seeded() -> None:
    items = [[float(v)] for v in range(1, 41)]
    low, high = bootstrap_interval(items, median_ratio)
    assert (low, high) == bootstrap_interval(items, median_ratio)
    assert low < 20.5 < high
    assert low > 10
    assert high < 31
    assert bootstrap_interval([[2.0]] * 10, median_ratio) == (2.0, 2.0)


def test_the_plot_draws_the_floor_rows(tmp_path: Path) -> None:
    runs = {(4, n): [_run(1.0, 4), _run(1.1, 4)] for n in (BASE, NULL, "k = 0", "k = 4")}
    rows = summarise(runs, [4], [BASE, NULL, "k = 0", "k = 4"])
    path = plot(rows, tmp_path / "floor.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_families_label_each_request_and_group_its_ratios() -> None:
    plans = {4: burst_plans(4, 2, 8, seed=4)}
    assert all(len(p.families) == 4 for p in plans[4])
    runs = {(4, n): [_run(1.0, 4), _run(1.0, 4)] for n in (BASE, "k = 0")}
    runs[(4, "k = 0")] = [_run(1.1, 4), _run(1.1, 4)]
    rows = by_family(runs, plans, [BASE, "k = 0"])
    families = {f for p in plans[4] for f in p.families}
    assert {r["family"] for r in rows} == families
    for row in rows:
        assert row["ttft"]["ratio"] == pytest.approx(1.1)
        assert row["tpot"]["ratio"] == pytest.approx(1.1)
    assert sum(r["tpot"]["n"] for r in rows) == 8  # each request in its own family once
    assert family_table(rows)[1].startswith("| family |")


def test_a_results_file_summarises_again_with_its_plans(tmp_path: Path) -> None:
    names = [BASE, NULL, "k = 0"]
    runs = {(c, n): [_run(1.0, c) for _ in range(2)] for c in (1, 4) for n in names}
    body = {
        "args": {
            "depths": [0],
            "null": True,
            "bursts": [2, 2],
            "concurrency": [1, 4],
            "max_tokens": 8,
        },
        "bursts": {f"c{c} {n}": [dataclasses.asdict(r) for r in rs] for (c, n), rs in runs.items()},
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(body))
    again, plans, read_names, profile = from_results(path)
    assert read_names == names
    assert profile == {}
    assert again == runs
    assert plans == {c: burst_plans(c, 2, 8, seed=c) for c in (1, 4)}
    lines: list[str] = []
    rows, families, _ = report(again, plans, read_names, lines.append)
    assert len(rows) == 4
    assert families
    assert any(line.startswith("| 4 | k = 0 | 2 |") for line in lines)


def test_variants_name_each_engine_and_depth() -> None:
    assert variants([0, 4], null=True) == {
        BASE: (BASE, 0),
        NULL: (BASE, 0),
        "k = 0": (SPEC, 0),
        "k = 4": (SPEC, 4),
    }
    assert list(variants([4], null=False, labels=["cap"])) == [BASE, "k = 4", "cap k = 4"]


def test_turns_run_in_a_seeded_random_order_that_favours_no_place() -> None:
    names = list(variants([0, 4], null=True))
    orders = [turn_order(a, names) for a in range(400)]
    assert orders[:5] == [turn_order(a, names) for a in range(5)]  # seeded: the same again
    assert all(sorted(o) == sorted(names) for o in orders)
    for name in names:  # each place about a quarter of the time
        for place in range(4):
            share = sum(o[place] == name for o in orders) / len(orders)
            assert 0.18 <= share <= 0.32, (name, place, share)


def test_a_variant_is_a_label_and_a_json_object_of_engine_arguments() -> None:
    label, extra = parse_variant('cap={"additional_config": {"specgw_prefill_step_depth": 1}}')
    assert label == "cap"
    assert extra == {"additional_config": {"specgw_prefill_step_depth": 1}}
    for bad in ("cap", "cap={", "cap=[1]", '={"a": 1}', f"{SPEC}={{}}"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_variant(bad)


def test_a_profiled_run_loads_the_timers_into_every_engine_under_the_variants_own() -> None:
    aux = {"worker_extension_cls": "bench.floor_timers.AuxKeptWorker"}
    args = argparse.Namespace(profile=True, variant=[("aux kept", aux)])
    engines = engine_extras(args)
    assert engines[BASE] == (False, PROFILED)
    assert engines[SPEC] == (True, PROFILED)
    assert engines["aux kept"] == (True, {**PROFILED, **aux})
    assert engine_extras(argparse.Namespace(profile=False, variant=[]))[SPEC] == (True, {})


def test_a_profiled_results_file_prints_the_attribution_per_phase(tmp_path: Path) -> None:
    names = [BASE, "k = 0"]
    runs = {(1, n): [_run(1.0, 1)] for n in names}
    worker = {"decode": {"execute_model": [0.06, 10], "sample_tokens": [0.01, 10]}}
    core = {"decode": {"core.step": [0.1, 10], "core.schedule": [0.005, 10]}}
    totals = {f"c1 {n}": {"decode": {**core["decode"], **worker["decode"]}} for n in names}
    body = {
        "args": {"depths": [0], "null": False, "bursts": [1], "concurrency": [1], "max_tokens": 8},
        "bursts": {f"c{c} {n}": [dataclasses.asdict(r) for r in rs] for (c, n), rs in runs.items()},
        "profile": totals,
    }
    path = tmp_path / "results.json"
    path.write_text(json.dumps(body))
    lines: list[str] = []
    report(*from_results(path)[:3], lines.append, from_results(path)[3])
    text = "\n".join(lines)
    assert "concurrency 1, decode steps" in text
    assert "execute_model" in text
    assert "6.000" in text


def test_the_medians_interval_is_the_sign_tests_order_statistics() -> None:
    values = [float(v) for v in range(1, 21)]  # n = 20: ranks 6 and 15 (95.9 % coverage)
    assert median_interval(values) == (10.5, 6.0, 15.0)
    values = [float(v) for v in range(1, 31)]  # n = 30: ranks 10 and 21
    assert median_interval(values)[1:] == (10.0, 21.0)
    # Five values cannot reach 95 % (the range covers 93.75 %): the range is returned.
    assert median_interval([3.0, 1.0, 2.0, 5.0, 4.0]) == (3.0, 1.0, 5.0)


def test_the_interval_covers_the_true_median_about_as_often_as_it_says() -> None:
    rng = random.Random(7)
    trials, hits = 2000, 0
    for _ in range(trials):
        sample = [rng.lognormvariate(0.0, 0.3) for _ in range(20)]
        _, low, high = median_interval(sample)
        hits += low <= 1.0 <= high  # the lognormal's median is exp(0) = 1
    assert 0.94 <= hits / trials <= 0.98  # 95.9 % by construction at n = 20


def test_child_processes_and_their_cpu_are_read_from_proc() -> None:
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nt = time.process_time()\n"
            "while time.process_time() - t < 0.3: pass\ntime.sleep(30)",
        ]
    )
    try:
        assert child.pid in descendants(os.getpid())
        with contextlib.suppress(AssertionError):  # the bounds below say what was wrong
            until_sync(lambda: cpu_seconds({child.pid}) >= 0.25, 20.0, poll_s=0.05)
        assert 0.25 <= cpu_seconds({child.pid}) < 5.0
    finally:
        child.kill()
        child.wait()
    assert cpu_seconds({child.pid}) == 0.0  # gone: nothing to read


def test_a_checkpoint_keeps_the_finished_concurrencies_for_summarise_only(tmp_path: Path) -> None:
    from bench.floor_interleaved import checkpoint

    names = [BASE, NULL, "k = 0"]
    runs = {(c, n): [_run(1.0, c) for _ in range(2)] for c in (1, 4) for n in names}
    runs[(4, "k = 0")] = runs[(4, "k = 0")][:1]  # c4 unfinished: it must not be written
    args = argparse.Namespace(
        depths=[0],
        null=True,
        bursts=[2, 2],
        concurrency=[1, 4],
        max_tokens=8,
        variant=[],
        out=tmp_path / "floor.json",
    )
    checkpoint(args, {1: 2}, runs, "model")
    again, plans, read_names, _ = from_results(tmp_path / "floor.partial.json")
    assert list(plans) == [1]
    assert read_names == names
    assert again == {key: v for key, v in runs.items() if key[0] == 1}
