"""The cpu-embedded profile built from a `make bench` run (`bench.twin.bench_profile`), the
validation's cut of the same run, and the shipped files naming that one run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.twin.bench_profile import from_bench_summary
from bench.twin.calibrated import beyond_largest
from bench.twin.schema import Profile, load_profile
from bench.twin.validation import real_run_cut

TWIN = Path(__file__).resolve().parents[2] / "bench" / "twin"


def _bench_summary() -> dict[str, Any]:
    """A `make bench` summary reduced to what the profile reads: two closed arrivals, k <= 2."""

    def cell(tpot: float, ttft50: float, ttft99: float, tps: float) -> dict[str, Any]:
        figures = {"tpot_p50_s": tpot, "ttft_p50_s": ttft50, "ttft_p99_s": ttft99}
        return {
            **{k: {"median": v / 1000} for k, v in figures.items()},
            "tokens_per_s": {"median": tps, "n": 3},
        }

    return {
        "meta": {"started": "2026-01-02T03:04:05Z", "seed": 7, "repeats": 3, "machine": "2 CPUs"},
        "step_costs": {
            "c1": {"step_ms": {"0": 10.0, "1": 15.0, "2": 18.0}},
            "c4": {"step_ms": {"0": 12.0, "1": 20.0, "2": 26.0}},
            "poisson3": {"step_ms": {"0": 11.0, "1": 99.0, "2": 99.0}},
        },
        "cells": {
            "no-spec": {"c1": cell(10.5, 20.0, 120.0, 90.0), "c4": cell(11.0, 30.0, 200.0, 300.0)},
            "k0": {"c1": cell(10.0, 22.0, 130.0, 88.0)},
            "static-k1": {"c1": cell(9.0, 25.0, 140.0, 95.0)},
            "static-k2": {"c1": cell(8.0, 21.0, 150.0, 97.0)},
        },
    }


def test_profile_from_a_bench_summary_follows_its_rule() -> None:
    prompts = [40] * 60 + [1040] * 39  # p50 40, p99 1040 tokens (bench.stats.percentile)
    data = from_bench_summary(_bench_summary(), prompts, 0.05, "CMD")
    profile = Profile.model_validate({"name": "p", **data, "zero_skips_drafter": True})
    assert profile.batch_stats == {1: {0: 10.0, 1: 15.0, 2: 18.0}, 4: {0: 12.0, 1: 20.0, 2: 26.0}}
    assert profile.max_k == 2
    assert profile.no_spec_step_ms == {1: 10.0, 4: 11.0}  # batch 1 capped at k = 0's 10.0
    # (TTFT p99 120 - p50 20 ms) / (1040 - 40 tokens); the drafter 0.05 of it
    assert profile.prefill_ms_per_token.model_dump() == {"target": 0.1, "drafter": 0.005}
    assert profile.first_token_extra_ms == {1: 3.0, 2: 0.0}  # k = 2 below k0's: none
    assert profile.workload == "make-bench"
    assert "CMD" in profile.source
    assert "2026-01-02T03:04:05Z" in profile.source


@pytest.mark.parametrize(
    ("path", "named"),
    [
        (("step_costs", "c4", "step_ms", "0"), "step_costs.c4.step_ms.0"),
        (("step_costs", "c1"), "step_costs.c1"),
        (("cells", "no-spec", "c4", "tpot_p50_s"), "cells.no-spec.c4.tpot_p50_s"),
        (("cells", "static-k2"), "cells.static-k2"),
        (("meta", "started"), "meta.started"),
    ],
    ids=lambda v: ".".join(v) if isinstance(v, tuple) else v,
)
def test_profile_from_a_bench_summary_names_a_missing_field(
    path: tuple[str, ...], named: str
) -> None:
    summary = _bench_summary()
    node = summary
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    with pytest.raises(ValueError, match=f"no `{named}`"):
        from_bench_summary(summary, [40, 1040], 0.0625, "CMD")


def test_the_validation_cut_keeps_tokens_per_s_and_names_its_run() -> None:
    cut = real_run_cut(_bench_summary(), "summary.json", "CMD")
    assert cut["cells"]["static-k1"] == {"c1": {"tokens_per_s": {"median": 95.0}}}
    assert cut["meta"] == {
        "started": "2026-01-02T03:04:05Z",
        "seed": 7,
        "repeats": 3,
        "machine": "2 CPUs",
    }
    assert "2026-01-02T03:04:05Z" in cut["source"]
    assert "CMD" in cut["source"]


def test_the_shipped_cpu_profile_and_its_validation_name_one_run() -> None:
    """The profile and the validation's tokens/s come from one run; while the committed
    summary is that run, the profile's step costs are the builder's from it (the prompt
    lengths aside: counting them needs the embedded model)."""
    profile = load_profile(TWIN / "profiles" / "cpu-embedded.json")
    real = json.loads((TWIN / "measurements" / "make-bench-cpu-embedded.json").read_text())
    started = real["meta"]["started"]
    assert f"run started {started}" in profile.source
    assert profile.zero_skips_drafter
    summary = json.loads((TWIN.parent / "results" / "summary.json").read_text())
    if summary["meta"]["started"] == started:
        data = from_bench_summary(summary, [1, 2], 1.0, "CMD")
        calibrations = sorted((TWIN / "measurements").glob("cpu-calibration-*.json"))
        assert calibrations, "the profile's batches past 16 come from saved calibrations"
        for path in calibrations:
            assert f"measurements/{path.name}" in profile.source
        data = beyond_largest(data, [(p.name, json.loads(p.read_text())) for p in calibrations])
        assert profile.batch_stats == Profile.model_validate({"name": "p", **data}).batch_stats
        assert profile.no_spec_step_ms == data["no_spec_step_ms"]


def _calibration(rows: dict[int, list[float]]) -> dict[str, Any]:
    """An /admin/costs answer reduced to its calibration: batch -> step ms at k = 0, 1, ..."""
    return {
        "calibration": [
            {"batch": b, "k": k, "step_ms": ms, "samples": 20, "timed_by": "steps"}
            for b, row in rows.items()
            for k, ms in enumerate(row)
        ]
    }


def test_batches_past_the_run_grow_as_the_calibrations_measured() -> None:
    data = from_bench_summary(_bench_summary(), [40, 1040], 0.05, "CMD")
    one = _calibration({1: [5.0, 7.0, 8.0], 4: [6.0, 8.0, 10.0], 8: [9.0, 16.0, 20.0]})
    two = _calibration({4: [6.0, 10.0, 10.0], 8: [12.0, 15.0, 30.0], 16: [1.0, 1.0, 1.0]})
    three = _calibration({4: [4.0, 8.0, 10.0], 8: [6.0, 12.0, 25.0]})
    grown = beyond_largest(data, [("a.json", one), ("b.json", two), ("c.json", three)])
    # batch 4 is the run's largest (12 / 20 / 26 ms); growth 4 -> 8 per depth, median of
    # (1.5, 2, 1.5) at k0, (2, 1.5, 1.5) at k1, (2, 3, 2.5) at k2; batch 16 is not in all three
    assert grown["batch_stats"][8] == {0: 18.0, 1: 30.0, 2: 65.0}
    assert 16 not in grown["batch_stats"]
    assert grown["batch_stats"][4] == data["batch_stats"][4]
    assert grown["no_spec_step_ms"][8] == 16.5  # batch 4's 11.0 x 1.5
    profile = Profile.model_validate({"name": "p", **grown})
    assert profile.step_ms(8, 2) == 65.0
    assert "a.json, b.json, c.json" in profile.source
    assert "k2 2.500 (2.000-3.000)" in (profile.notes or "")


@pytest.mark.parametrize(
    ("rows", "error"),
    [
        (
            {1: [5.0, 7.0, 8.0], 8: [9.0, 16.0, 20.0]},
            r"x.json: no calibration at batch 4, k = \[0, 1, 2\]",
        ),
        ({4: [6.0, 8.0], 8: [9.0, 16.0, 20.0]}, r"x.json: no calibration at batch 4, k = \[2\]"),
        ({4: [6.0, 8.0, 10.0], 8: [9.0, 16.0]}, "x.json: no batch above 4 calibrated at every k"),
        ({1: [6.0, 8.0, 10.0], 4: [9.0, 16.0, 20.0]}, "x.json: no batch above 4"),
    ],
    ids=["no-base-batch", "base-lacks-a-depth", "above-lacks-a-depth", "nothing-above"],
)
def test_a_calibration_that_cannot_carry_the_profile_is_named(
    rows: dict[int, list[float]], error: str
) -> None:
    data = from_bench_summary(_bench_summary(), [40, 1040], 0.05, "CMD")
    with pytest.raises(ValueError, match=error):
        beyond_largest(data, [("x.json", _calibration(rows))])


def test_calibrations_without_a_common_larger_batch_are_refused() -> None:
    data = from_bench_summary(_bench_summary(), [40, 1040], 0.05, "CMD")
    a = _calibration({4: [6.0, 8.0, 10.0], 8: [9.0, 16.0, 20.0]})
    b = _calibration({4: [6.0, 8.0, 10.0], 16: [9.0, 16.0, 20.0]})
    with pytest.raises(ValueError, match="share no batch above 4"):
        beyond_largest(data, [("a", a), ("b", b)])


def test_the_builder_names_a_calibration_that_cannot_carry_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the command line a bad `--beyond` file is a usage error naming it, not a traceback.
    (The run's prompt lengths are given: counting them needs the embedded model.)"""
    import typer

    from bench.twin import build_profile

    monkeypatch.setattr(build_profile, "run_inputs", lambda summary: ([40, 1040], 0.05))
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(_bench_summary()))
    bad = tmp_path / "costs.json"
    bad.write_text(json.dumps(_calibration({1: [5.0, 7.0, 8.0]})))
    with pytest.raises(typer.BadParameter, match=r"costs.json: no calibration at batch 4"):
        build_profile.main(out=tmp_path / "p.json", bench_summary=summary, beyond=[bad])
    assert not (tmp_path / "p.json").exists()
