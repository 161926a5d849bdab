"""The pure parts of `bench.floor_interleaved`: burst plans, per-request pairing, the
burst bootstrap and the summary rows; `bench.stats.bootstrap_interval`. No engine starts."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

import pytest

from bench.floor_interleaved import (
    BurstRun,
    burst_plans,
    by_family,
    family_table,
    from_results,
    median_ratio,
    paired_ratios,
    plot,
    report,
    summarise,
    table,
)
from bench.floor_resident import BASE, NULL
from bench.stats import bootstrap_interval


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
    again, plans, read_names = from_results(path)
    assert read_names == names
    assert again == runs
    assert plans == {c: burst_plans(c, 2, 8, seed=c) for c in (1, 4)}
    lines: list[str] = []
    rows, families = report(again, plans, read_names, lines.append)
    assert len(rows) == 4
    assert families
    assert any(line.startswith("| 4 | k = 0 | 2 |") for line in lines)
