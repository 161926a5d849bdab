"""`make bench-quick` end to end on the real gateway and engine: the harness, not the numbers.

No timing assertions: this catches regressions in the harness (a mode that no
longer applies, a report that is not produced or not well-formed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import QUICK
from bench.runner import load_runs

REPO = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n"
#: A loaded 2-core host has needed more than 10 minutes for the quick run.
RUN_TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench-quick")
    cmd = [sys.executable, "-m", "bench", "run", "--quick", "--out", str(out), "--no-publish"]
    # Its own process group: on a timeout the whole tree goes (the gateways and their
    # engine cores are the run's children), not the run alone, which would leave them to
    # load the host under the tests after it. Not its own session, which autogroup
    # scheduling would make a CPU group of its own (`tests/gateway/conftest.py`).
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
    )
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(
            f"bench run --quick ran past {RUN_TIMEOUT_S} s:\n{stdout[-3000:]}{stderr[-3000:]}"
        )
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    return out


@pytest.mark.engine
def test_quick_run_writes_every_artifact(quick_run: Path) -> None:
    for name in ("meta.json", "runs.jsonl", "summary.json", "report.md", "overhead.json"):
        assert (quick_run / name).stat().st_size > 0, name
    for name in ("tokens_per_s.png", "k_over_time.png", "acceptance_over_time.png"):
        assert (quick_run / name).read_bytes()[:8] == PNG, name


@pytest.mark.engine
def test_quick_run_is_complete_and_modes_applied(quick_run: Path) -> None:
    runs = load_runs(quick_run / "runs.jsonl")
    assert sorted(r.key.mode for r in runs) == sorted(QUICK.modes or [])
    per_run = json.loads((quick_run / "meta.json").read_text())["requests_per_run"]
    for run in runs:
        assert len(run.records) == per_run
        assert all(r.ok for r in run.records), [r.error for r in run.records if not r.ok]
        assert all(r.output_tokens > 0 and r.ttft is not None for r in run.records)
        assert not run.notes, run.notes
        if run.key.mode.startswith("static-k") or run.key.mode == "k0":
            want = 0 if run.key.mode == "k0" else int(run.key.mode.removeprefix("static-k"))
            assert {r.k for r in run.records} == {want}
        if run.key.mode in ("no-spec", "k0"):
            assert all(r.draft_tokens == 0 for r in run.records)


@pytest.mark.engine
def test_quick_summary_and_report_are_well_formed(quick_run: Path) -> None:
    summary = json.loads((quick_run / "summary.json").read_text())
    assert set(summary["cells"]) == set(QUICK.modes or [])
    for cells in summary["cells"].values():
        cell = cells["c4"]
        assert cell["errors"] == 0
        assert cell["tokens_per_s"]["median"] > 0
        assert cell["tpot_p50_s"]["median"] > 0
        assert set(cell["acceptance_by_class"]) == set(cell["mean_k_by_class"])
    assert summary["oracle"]["c4"]["choice"]
    claims = [c["claim"] for c in summary["checks"]]
    assert any("best static" in c for c in claims)
    assert any("requests/s per core" in c for c in claims)
    assert summary["overhead"]["requests_per_s_per_core"] > 0
    report = (quick_run / "report.md").read_text()
    for heading in ("## Checks", "## Modes", "## Gateway overhead", "## By class"):
        assert heading in report
    # Every speculative gateway's cost model, saved at the end and set in the report
    # beside the step costs the static modes measured.
    assert set(summary["cost_models"]) == {"spec", "spec-adaptive"}
    assert all(buckets for buckets in summary["cost_models"].values())
    assert summary["step_costs"]["c4"]["relative"]["0"] == 1.0
    assert "| c4 | spec-adaptive model (bucket 4) |" in report
