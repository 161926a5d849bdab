"""`bench.floor_versus` (a variant against the best static depth and per-class depths of
the same bursts, and the outputs' identity) and the pure parts of
`bench.vllm_bench_client`. No engine starts."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

from bench.floor_interleaved import variants
from bench.floor_summary import BurstRun, Plan
from bench.floor_versus import chosen, digest, identity, static_depths, versus, versus_table
from bench.vllm_bench_client import Bench, bench_command, summary

#: TPOT in ms of each family at each static depth: x is fastest at k = 1, y at k = 3,
#: and k = 2 is the best one depth for both.
TPOT_MS = {"x": {0: 10, 1: 6, 2: 7, 3: 9}, "y": {0: 10, 1: 8, 2: 6.5, 3: 5}}
FAMILIES = ("x", "y", "x", "y")


def _runs(variant_ms: dict[str, float], bursts: int = 6) -> tuple[dict, dict, list[str]]:
    names = [*(f"k = {d}" for d in range(4)), "budget k = 3"]
    plans = {4: [Plan(("t",) * 4, (8,) * 4, FAMILIES) for _ in range(bursts)]}
    runs: dict[tuple[int, str], list[BurstRun]] = {}
    for name in names:
        burst_runs = []
        for b in range(bursts):
            noise = 1.0 + 0.01 * ((b * 7) % 3)
            if name.startswith("k = "):
                ms = [TPOT_MS[f][int(name[4:])] for f in FAMILIES]
            else:
                ms = [variant_ms[f] for f in FAMILIES]
            burst_runs.append(BurstRun(tpot=[noise * m / 1e3 for m in ms]))
        runs[(4, name)] = burst_runs
    return runs, plans, names


def test_the_references_are_the_best_depth_for_all_and_each_familys_own() -> None:
    runs, plans, names = _runs({"x": 6, "y": 5})  # exactly the per-class depths
    (row,) = versus(runs, plans, names, "budget k = 3")
    assert row["best_static"] == 2
    assert row["class_depths"] == {"x": 1, "y": 3}
    assert abs(row["vs_per_class"]["ratio"] - 1.0) < 1e-9
    # against one depth for both: x 7 / 6, y 6.5 / 5 -> the median of the four requests
    assert 7 / 6 - 1e-9 <= row["vs_best_static"]["ratio"] <= 6.5 / 5 + 1e-9
    assert row["vs_per_class"]["n"] == 4 * 6


def test_a_variant_faster_than_every_static_depth_reads_above_one() -> None:
    runs, plans, names = _runs({"x": 3, "y": 2.5})  # half of each family's best
    (row,) = versus(runs, plans, names, "budget k = 3")
    assert abs(row["vs_per_class"]["ratio"] - 2.0) < 0.05
    low, high = row["vs_per_class"]["ci95"]
    assert 1.9 < low <= high < 2.1
    assert any("budget k = 3" in line for line in versus_table([row], []))


def test_the_depths_are_chosen_on_the_other_half_of_the_bursts() -> None:
    runs, plans, names = _runs({"x": 6, "y": 5})
    # On odd bursts only, k = 0 is made the fastest for x.
    for b, run in enumerate(runs[(4, "k = 0")]):
        if b % 2:
            run.tpot[0] = run.tpot[2] = 1e-3
    statics = {n: runs[(4, n)] for n in static_depths(names)}
    assert chosen(statics, plans[4], parity=1)[1]["x"] == "k = 0"
    assert chosen(statics, plans[4], parity=0)[1]["x"] == "k = 1"
    (row,) = versus(runs, plans, names, "budget k = 3")
    # Odd bursts are read against even bursts' choice (k = 1: 6 ms, as fast as the
    # variant), even ones against k = 0 (10 ms): never against the odd bursts' 1 ms.
    assert row["vs_per_class"]["ci95"][0] >= 1.0 - 1e-9


def test_identity_counts_requests_whose_output_matches_k0() -> None:
    same, other = digest([1, 2, 3]), digest([1, 2, 4])
    assert same == digest([1, 2, 3]) != other
    runs = {
        (1, "k = 0"): [BurstRun(digests=[same]), BurstRun(digests=[same])],
        (1, "k = 4"): [BurstRun(digests=[same]), BurstRun(digests=[other])],
        (1, "no drafter"): [BurstRun(digests=[""]), BurstRun(digests=[same])],
    }
    rows = identity(runs, [1], ["no drafter", "k = 0", "k = 4"])
    assert {r["variant"]: (r["identical"], r["of"]) for r in rows} == {
        "no drafter": (1, 1),  # a request without a digest is left out
        "k = 4": (1, 2),
    }


def test_static_depths_are_the_speculative_engines_variants_only() -> None:
    names = list(variants([0, 2], null=True, labels=["budget"], variant_depths=[4]))
    assert names[-1] == "budget k = 4"
    assert "budget k = 0" not in names
    assert static_depths(names) == {"k = 0": 0, "k = 2": 2}


def test_the_bench_command_is_vllms_chat_client_greedy_to_a_fixed_length(tmp_path: Path) -> None:
    server = SimpleNamespace(base_url="http://127.0.0.1:1", model="m")
    cmd = bench_command(server, tmp_path, tmp_path / "p.jsonl", Bench(4, 16, 128), tmp_path / "o")
    flags = dict(itertools.pairwise(cmd))
    assert cmd[3:5] == ["bench", "serve"]
    assert flags["--backend"] == "openai-chat"
    assert flags["--endpoint"] == "/v1/chat/completions"
    assert flags["--dataset-name"] == "sharegpt"
    assert flags["--max-concurrency"] == "4"
    assert flags["--num-prompts"] == "16"
    assert flags["--sharegpt-output-len"] == "128"
    assert flags["--temperature"] == "0"
    assert "--ignore-eos" in cmd
    assert "--disable-shuffle" in cmd


def test_the_summary_sets_each_gateway_turn_against_the_same_alternations() -> None:
    def turn(server: str, tps: float) -> dict:
        return {"server": server, "passes": {"16": {"output_throughput": tps}}}

    turns = [turn("gateway", 90), turn("vllm-k0", 100), turn("vllm-k0", 80), turn("gateway", 88)]
    lines = summary(turns, ["gateway", "vllm-k0"])
    row = lines[-1]
    assert row.startswith("| 16 |")
    assert "| 1.000 [0.900-1.100] |" in row  # 90 / 100 and 88 / 80
