"""`make gpu-smoke`'s script (`bench.gpu_smoke`): what fails a smoke run, what it prints,
and the whole script end to end in its dry mode on the CPU build (engine-marked)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from bench.gpu_smoke import PhaseResult, SmokeRecord, failures, parse_args, phases, report
from tests.gateway.conftest import TEST_CALIBRATION


def _phase(name: str, *records: SmokeRecord, wall_s: float = 2.0) -> PhaseResult:
    return PhaseResult(name, wall_s, [replace(r, phase=name) for r in records])


def _rec(index: int, text: str, **kw: object) -> SmokeRecord:
    fields: dict[str, object] = {"finish_reason": "length", "output_tokens": 10, "greedy": True}
    fields.update(kw)
    return SmokeRecord("", index, "code", text=text, **fields)  # type: ignore[arg-type]


def _run(spec: list[SmokeRecord], plain: list[SmokeRecord]) -> list[str]:
    return failures(
        [_phase("adaptive", *spec), _phase("static-k4", *spec), _phase("no-spec", *plain)]
    )


def test_identical_greedy_outputs_pass() -> None:
    assert _run([_rec(0, "abc"), _rec(1, "xyz")], [_rec(0, "abc"), _rec(1, "xyz")]) == []


def test_a_greedy_output_that_differs_fails_with_where() -> None:
    found = _run([_rec(0, "abcd")], [_rec(0, "abXd")])
    assert found == [
        "greedy output of #0 code differs at character 2 between static-k4 and no-spec"
    ]


def test_a_sampled_output_may_differ() -> None:
    assert _run([_rec(0, "abcd", greedy=False)], [_rec(0, "wxyz", greedy=False)]) == []


def test_an_error_or_a_stream_without_a_terminal_state_fails() -> None:
    found = _run([_rec(0, "a", finish_reason=None)], [_rec(0, "a", error="APIError: boom")])
    assert any("stream ended without a finish reason" in f for f in found)
    assert any("APIError: boom" in f for f in found)


def test_the_report_prints_tokens_per_second_and_classes() -> None:
    spec = [_rec(0, "a", gw_class="code", k=4, acceptance_length=2.5, output_tokens=30)]
    text = report(
        [
            _phase("adaptive", *spec),
            _phase("static-k4", *spec),
            _phase("no-spec", *spec, wall_s=3.0),
        ]
    )
    assert "static-k4            15.0     1.50x" in text
    assert "code" in text
    assert "4.00" in text
    assert "2.50" in text


def test_three_phases_on_one_engine() -> None:
    assert [name for name, _ in phases(3)] == ["adaptive", "static-k3", "no-spec"]
    assert parse_args(["--dry"]).dry


def _dry_smoke(out: Path, **env: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "bench.gpu_smoke", "--dry", "--per-family", "1"]
    cmd += ["--max-tokens", "8", "--concurrency", "2", "--out", str(out)]
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=1200, check=False, env={**os.environ, **env}
    )


@pytest.mark.engine
def test_the_script_runs_end_to_end_on_the_fake_backend(tmp_path: Path) -> None:
    """The whole script (a `spec-gateway serve` process, flags, phases, report) with no
    model: the engine tier, since it starts a server process."""
    done = _dry_smoke(tmp_path, SPECGW_ENGINE_BACKEND="fake")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu-smoke: ok (" in done.stdout
    assert "static-k4" in done.stdout


@pytest.mark.engine
def test_the_dry_smoke_runs_end_to_end(tmp_path: Path) -> None:
    """The same script on the CPU build and the embedded model, tiny sizes: 0 = passed."""
    # Calibrated as the suite's other gateways are.
    done = _dry_smoke(tmp_path, **TEST_CALIBRATION)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "gpu-smoke: ok" in done.stdout
    assert "no-spec" in done.stdout
    assert (tmp_path / "gpu_smoke.json").is_file()
