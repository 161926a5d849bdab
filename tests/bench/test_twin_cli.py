"""`python -m bench twin`: which profile runs which workload, and the quick run's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.__main__ import app
from bench.twin.cli import PROFILES, WORKLOADS, select_cases
from bench.twin.schema import TwinInputError

FIXTURES = Path(__file__).parent / "twin_fixtures"


def test_shipped_profiles_run_their_own_workloads() -> None:
    cases = {c.profile.name: c.workload.name for c in select_cases([], [])}
    assert cases["cpu-embedded"] == "make-bench"
    assert len(cases) == len(list(PROFILES.glob("*.json")))
    assert all(w == "production-mix" for p, w in cases.items() if p != "cpu-embedded")


def test_one_workload_applies_to_every_profile_and_counts_must_match() -> None:
    profiles = sorted(PROFILES.glob("*.json"))[:2]
    workload = FIXTURES / "workload_small.json"
    assert {c.workload.name for c in select_cases(profiles, [workload])} == {"test-mix"}
    with pytest.raises(TwinInputError, match="2 workloads for 3 profiles"):
        select_cases([*profiles, FIXTURES / "profile_small.json"], [workload, workload])
    assert {p.stem for p in WORKLOADS.glob("*.json")} >= {"make-bench", "production-mix"}


def test_quick_run_writes_summary_report_and_plots(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["twin", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "summary.json").read_text())
    (profile,) = summary["profiles"].values()
    assert len(profile["arrivals"]) == 2
    assert (tmp_path / "report.md").read_text().startswith("# Engine twin report")
    assert {p.name.split("_")[0] for p in tmp_path.glob("*.png")} == {
        "headline.png",
        "tokens",
        "k",
        "acceptance",
    }
    # Set beside the real runs again as they are: the same summary, byte for byte.
    before = (tmp_path / "summary.json").read_bytes()
    again = CliRunner().invoke(app, ["twin", "revalidate", "--out", str(tmp_path)])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "summary.json").read_bytes() == before


def test_the_cli_admission_limit_default_is_the_engines() -> None:
    from bench.twin import cli, engine

    assert cli.MAX_RUNNING == engine.MAX_RUNNING


def test_the_headline_puts_each_profiles_arrivals_in_order_and_skips_absent_modes(
    tmp_path: Path,
) -> None:
    from bench.twin.plots import _arrival_order, headline_plot

    assert sorted(["poisson-load0.8", "c16", "c4", "c1"], key=_arrival_order) == [
        "c1",
        "c4",
        "c16",
        "poisson-load0.8",
    ]
    cell = {"ratios": {"adaptive/best-static": {"median": 1.01}}}
    summary = {"profiles": {"p": {"arrivals": {"c4": cell, "c1": cell}}}}
    headline_plot(summary, tmp_path / "headline.png")
    assert (tmp_path / "headline.png").read_bytes()[:4] == b"\x89PNG"


def test_a_bad_input_file_is_a_usage_error_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"name": "x"}')
    wide = {"COLUMNS": "4000", "TERMINAL_WIDTH": "4000"}
    args = ["twin", "--profile", str(bad), "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args, env=wide)
    assert result.exit_code == 2
    # The error panel may still fold a long path across its lines: read it unfolded.
    unfolded = "".join(c for c in result.output if not c.isspace() and c not in "│╭╮╰╯─")
    assert "bad.json" in unfolded


def test_from_classes_round_trip_through_the_twin(tmp_path: Path) -> None:
    """The twin's own controller's /admin/classes answer becomes a workload the twin runs."""
    from bench.twin.costs import StepCosts
    from bench.twin.engine import MAX_RUNNING, VirtualClock, simulate
    from bench.twin.modes.adaptive import AdaptiveControl
    from bench.twin.requests import build_requests
    from bench.twin.runner import scaled
    from bench.twin.schema import load_profile, load_workload

    profile = load_profile(FIXTURES / "profile_small.json")
    workload = scaled(load_workload(FIXTURES / "workload_small.json"), 120)
    costs, clock = StepCosts.of(profile, MAX_RUNNING), VirtualClock()
    source = AdaptiveControl(workload, costs, clock, 1)
    simulate(build_requests(workload, 1), source, costs, clock, clients=4)
    reports = [r.to_dict() for r in source.plane.controller.snapshot()]
    classes = tmp_path / "classes.json"
    classes.write_text(json.dumps({"object": "list", "data": reports}))
    built = tmp_path / "built.json"
    result = CliRunner().invoke(app, ["twin", "from-classes", str(classes), "--out", str(built)])
    assert result.exit_code == 0, result.output
    assert len(load_workload(built).classes) == len(reports)
