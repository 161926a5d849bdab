"""One seed, one summary: byte-identical `summary.json` in one process and across two
processes with different string hashing (no set or dict order leaks into a result)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.twin.runner import Case, run_case, scaled
from bench.twin.schema import load_profile, load_workload
from bench.twin.summary import build_summary

FIXTURES = Path(__file__).parent / "twin_fixtures"
REPO = Path(__file__).resolve().parents[2]


def _summary_text(seed: int) -> str:
    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 120)
    run = run_case(Case(profile, workload), [seed])
    return json.dumps(build_summary([run], [seed]), indent=1, sort_keys=True)


def test_two_runs_with_one_seed_give_the_same_summary() -> None:
    first = _summary_text(5)
    assert first == _summary_text(5)
    assert first != _summary_text(6)


def test_the_summary_does_not_depend_on_string_hashing(tmp_path: Path) -> None:
    texts = []
    for hash_seed in ("0", "4242"):
        out = tmp_path / hash_seed
        command = [
            sys.executable,
            "-m",
            "bench",
            "twin",
            "--profile",
            str(FIXTURES / "profile_small.json"),
            "--workload",
            str(FIXTURES / "workload_small.json"),
            "--requests",
            "80",
            "--seeds",
            "1",
            "--out",
            str(out),
        ]
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        subprocess.run(command, cwd=REPO, env=env, check=True, capture_output=True, timeout=300)
        texts.append((out / "summary.json").read_bytes())
    assert texts[0] == texts[1]
