"""The summary's ratios and checks, the validation table, and the report from a JSON round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bench.twin.metrics import settle_points
from bench.twin.records import RequestRecord
from bench.twin.report import UNDRAFTED_NOTE, _settle, render
from bench.twin.requests import Segment
from bench.twin.summary import (
    CONFLICT_BOUND,
    CONFLICT_HINDSIGHT,
    CONFLICT_NONE,
    NEAR_PERCENT,
    UNDRAFTED,
    best_static,
    checks,
    rounded,
    seed_ratios,
    worst_settle,
)
from bench.twin.validation import compare, compare_verify, kendall_tau


def _mode(tps: float, speeds: dict[str, float]) -> dict[str, Any]:
    return {"tokens_per_s": tps, "class_speed": speeds}


MODES = {
    "nospec": _mode(100.0, {"a": 10.0, "b": 10.0}),
    "static-k0": _mode(95.0, {"a": 9.5, "b": 9.5}),
    "static-k1": _mode(120.0, {"a": 13.0, "b": 11.0}),
    "static-k2": _mode(110.0, {"a": 14.0, "b": 8.0}),
    "vllm-schedule": _mode(118.0, {"a": 13.0, "b": 10.0}),
    "sglang-adaptive": _mode(115.0, {"a": 13.0, "b": 9.0}),
    "trtllm-threshold": _mode(121.0, {"a": 13.0, "b": 11.0}),
    "adaptive": _mode(126.0, {"a": 14.0, "b": 9.8}),
    "oracle": _mode(125.0, {"a": 14.0, "b": 11.0}),
}


def test_best_static_is_the_speculative_engines_best_fixed_depth() -> None:
    assert best_static(MODES, 2) == "static-k1"
    assert best_static({**MODES, "nospec": _mode(130.0, {})}, 2) == "static-k1"
    assert best_static({**MODES, "static-k0": _mode(130.0, {})}, 2) == "static-k0"


def test_seed_ratios() -> None:
    r = seed_ratios(MODES, 2)
    assert r["adaptive/best-static"] == pytest.approx(126 / 120)
    assert r["oracle/best-static"] == pytest.approx(125 / 120)
    assert r["adaptive/oracle"] == pytest.approx(126 / 125)
    assert r["adaptive/trtllm-threshold"] == pytest.approx(126 / 121)
    assert r["worst-class:adaptive"] == pytest.approx(0.98)
    assert r["worst-class:static-k2"] == pytest.approx(0.8)
    assert r["nospec/best-static"] == pytest.approx(100 / 120)
    assert r["static-k2/best-static"] == pytest.approx(110 / 120)


def _cell(ratios: dict[str, float], settle: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "ratios": {n: {"min": v, "median": v, "max": v} for n, v in ratios.items()},
        "settle": {"1": {"adaptive": settle}},
    }


def test_checks_read_medians_skip_the_cold_start_and_add_the_large_ceiling_claim() -> None:
    settle = [
        {"stretch": "p0", "start": 0, "classes": {"a": 99}},
        {"stretch": "p1", "start": 50, "classes": {"a": 3, "b": 25}},
    ]
    ratios = {**seed_ratios(MODES, 2), "oracle/best-static": 1.2}
    out = {c["claim"]: c for c in checks({"c4": _cell(ratios, settle), "poisson1": {}})}
    assert out["c4: adaptive / best static"]["pass"] is True
    assert out["c4: worst class / no spec"]["pass"] is False  # 0.98 < 0.99
    assert out["c4: k settles after a shift (p1/b)"]["value"] == 25
    assert out["c4: oracle ceiling 1.200 > 1.1: adaptive / best static"]["pass"] is False
    assert not any(c.startswith("poisson") for c in out)


def test_a_worst_class_claim_says_where_no_mode_reaches_both_targets() -> None:
    """Static k = 1, the threshold baseline and the oracle reach both targets in `MODES`;
    with their worst class below the floor, none does; with the clairvoyant bound reaching
    both, the claim says that only it does, and with the oracle too, that only the
    hindsight yardsticks do; a passing claim says none of it."""
    settle: list[dict[str, Any]] = []
    claim = "c4: worst class / no spec"

    def worst_claims(modes: dict[str, Any]) -> list[str]:
        out = checks({"c4": _cell(seed_ratios(modes, 2), settle)})
        return [c["claim"] for c in out if c["claim"].startswith(claim)]

    assert worst_claims(MODES) == [claim]
    weak = {m: _mode(f["tokens_per_s"], {**f["class_speed"], "b": 9.0}) for m, f in MODES.items()}
    weak["nospec"] = MODES["nospec"]
    assert worst_claims(weak) == [f"{claim} ({CONFLICT_NONE})"]
    bound = {**weak, "upper-bound": _mode(130.0, {"a": 15.0, "b": 10.0})}
    assert worst_claims(bound) == [f"{claim} ({CONFLICT_BOUND})"]
    hindsight = {**bound, "oracle": _mode(125.0, {"a": 14.0, "b": 11.0})}
    assert worst_claims(hindsight) == [f"{claim} ({CONFLICT_HINDSIGHT})"]
    fine = {**MODES, "adaptive": _mode(126.0, {"a": 14.0, "b": 10.0})}
    assert worst_claims(fine) == [claim]


def test_near_best_settling_is_checked_beside_the_strict_one() -> None:
    settle = [{"stretch": "p1", "start": 50, "classes": {"a": 30}}]
    near = [{"stretch": "p1", "start": 50, "classes": {"a": 4}}]
    cell = {**_cell(seed_ratios(MODES, 2), settle), "near_settle": {"1": {"adaptive": near}}}
    out = {c["claim"]: c for c in checks({"c4": cell})}
    assert out["c4: k settles after a shift (p1/a)"]["pass"] is False
    near_claim = f"c4: k near-best ({NEAR_PERCENT} %) after a shift (p1/a)"
    assert out[near_claim]["value"] == 4
    assert out[near_claim]["pass"] is True


def test_near_best_settling_counts_depths_within_the_hysteresis_of_the_best() -> None:
    """Depths 5 and 6 within 0.5 % of each other: alternating between them is near-best
    at once, though the strict figure never settles; a stretch at depth 3 first, 10 %
    below, is not."""
    goodput = {3: 0.9, 5: 0.996, 6: 1.0}
    cut = Segment(0, 40, 0, "p0")

    def record(i: int, k: int) -> RequestRecord:
        return RequestRecord(i, 0, 0, 0, 0.0, 0.0, 1.0, 10, k, k, 5, 5, 5, load=4)

    def curve(r: RequestRecord) -> tuple[float, ...]:
        return tuple(goodput.get(k, 0.5) for k in range(8))

    flapping = [record(i, 5 if i % 2 else 6) for i in range(40)]
    strict = settle_points(flapping, [cut], ["a"])[0]["classes"]["a"]
    assert strict > 20
    assert settle_points(flapping, [cut], ["a"], curve)[0]["classes"]["a"] == 0
    late = [record(i, 3 if i < 12 else 6) for i in range(40)]
    # 90 % of the rest near-best from request 9 on (28 of 31)
    assert settle_points(late, [cut], ["a"], curve)[0]["classes"]["a"] == 9


def test_worst_settle_over_seeds_and_stretches() -> None:
    settle = {
        "1": {"adaptive": [{"stretch": "x", "start": 10, "classes": {"a": 4}}]},
        "2": {"adaptive": [{"stretch": "y", "start": 10, "classes": {"b": 7}}]},
    }
    assert worst_settle(settle, "adaptive") == ("y/b", 7, False)
    assert worst_settle(settle, "adaptive-floor") is None


def test_a_class_whose_requests_off_its_best_never_drafted_is_named() -> None:
    """A class chose depth 3 where 0 is best and its batch held every request at k = 0:
    its near-best figure is named undrafted; the same stretch where its requests drafted
    at the depth it chose is not, nor is one that settled at once."""
    cut = Segment(0, 30, 0, "p0")
    goodput = (1.0, 0.9, 0.85, 0.8)

    def record(i: int, drafts: int) -> RequestRecord:
        return RequestRecord(i, 0, 0, 0, 0.0, 0.0, 1.0, 10, 0, 3, 5, drafts, 0, load=4)

    def curve(r: RequestRecord) -> tuple[float, ...]:
        return goodput

    held = settle_points([record(i, 0) for i in range(30)], [cut], ["a"], curve)[0]
    assert held["classes"]["a"] == 30
    assert held["undrafted"] == ["a"]
    ran = settle_points([record(i, 15) for i in range(30)], [cut], ["a"], curve)[0]
    assert ran["classes"]["a"] == 30
    assert ran["undrafted"] == []
    assert "undrafted" not in settle_points([record(i, 0) for i in range(30)], [cut], ["a"])[0]
    near = [record(i, 0) for i in range(30)]
    settled = settle_points(near, [cut], ["a"], lambda r: (0.8, 0.8, 0.8, 1.0))[0]
    assert settled["classes"]["a"] == 0
    assert settled["undrafted"] == []


def test_an_undrafted_figure_says_so_in_its_claim_and_report() -> None:
    settle = [{"stretch": "p1", "start": 50, "classes": {"a": 0}}]
    near = [{"stretch": "p1", "start": 50, "classes": {"a": 40, "b": 3}, "undrafted": ["a"]}]
    cell = {**_cell(seed_ratios(MODES, 2), settle), "near_settle": {"1": {"adaptive": near}}}
    out = {c["claim"]: c for c in checks({"c4": cell})}
    claim = f"c4: k near-best ({NEAR_PERCENT} %) after a shift (p1/a; {UNDRAFTED})"
    assert out[claim]["value"] == 40
    assert out[claim]["pass"] is False
    table = "\n".join(_settle({"c4": cell}, "adaptive", "near_settle"))
    assert "| p1 / a | 40* |" in table
    assert "| p1 / b | 3 |" in table
    assert UNDRAFTED_NOTE in table
    assert UNDRAFTED_NOTE not in "\n".join(_settle({"c4": cell}, "adaptive", "settle"))


def test_rounded_keeps_six_significant_digits_and_string_keys() -> None:
    assert rounded({1: [1 / 3, 2], "x": 123456.789}) == {"1": [0.333333, 2], "x": 123457.0}


@pytest.mark.parametrize(
    ("a", "b", "tau"),
    [
        ({"x": 1, "y": 2, "z": 3}, {"x": 10, "y": 20, "z": 30}, 1.0),
        ({"x": 1, "y": 2, "z": 3}, {"x": 30, "y": 20, "z": 10}, -1.0),
        ({"x": 1, "y": 2, "z": 3}, {"x": 10, "y": 30, "z": 20}, 1 / 3),
    ],
)
def test_kendall_tau(a: dict[str, float], b: dict[str, float], tau: float) -> None:
    assert kendall_tau(a, b) == pytest.approx(tau)


def _twin_profile() -> dict[str, Any]:
    tps = {"nospec": 100.0, "static-k1": 90.0, "adaptive": 110.0, "upper-bound": 200.0}
    return {
        "workload": "make-bench",
        "arrivals": {"c1": {"tokens_per_s": {m: {"median": v} for m, v in tps.items()}}},
    }


def test_validation_sets_relative_figures_side_by_side() -> None:
    real = {
        "cells": {
            "no-spec": {"c1": {"tokens_per_s": {"median": 50.0}}},
            "static-k1": {"c1": {"tokens_per_s": {"median": 40.0}}},
            "adaptive": {"c1": {"tokens_per_s": {"median": 60.0}}},
        }
    }
    out = compare(_twin_profile(), real)
    rows = {r["mode"]: r for r in out["rows"]}
    assert set(rows) == {"static-k1", "adaptive"}  # upper-bound has no real counterpart
    assert rows["static-k1"]["real"] == pytest.approx(0.8)
    assert rows["static-k1"]["twin"] == pytest.approx(0.9)
    assert rows["adaptive"]["difference"] == pytest.approx(1.1 / 1.2 - 1)
    assert out["ranking"]["c1"] == {
        "kendall_tau": 1.0,
        "real_best": "adaptive",
        "twin_best": "adaptive",
    }


def _budget_twin() -> dict[str, Any]:
    seed = {
        "static-k2": {"tokens_per_s": 100.0},
        "oracle": {"tokens_per_s": 104.0},
        "gateway-av": {"tokens_per_s": 110.0},
    }
    cell = {"seeds": {"1": seed}, "best_static": {"1": "static-k2"}}
    return {"arrivals": {"c1": cell, "c4": cell, "c64": cell}}


def test_the_budget_row_reads_the_real_engines_versus_rows_where_measured(tmp_path: Any) -> None:
    pending = compare_verify(_budget_twin(), tmp_path)
    assert [r["arrival"] for r in pending["rows"]] == ["c1", "c4"]
    assert pending["rows"][0]["twin_vs_best_static"] == pytest.approx(1.1)
    assert pending["rows"][0]["twin_vs_per_class"] == pytest.approx(110 / 104)
    assert pending["rows"][0]["real_vs_best_static"] is None
    assert pending["source"].startswith("not measured yet")
    cell = {"ratio": 1.09, "ci95": [1.02, 1.15], "n": 80}
    versus = [
        {"concurrency": 1, "variant": "k = 0", "vs_best_static": {"ratio": 0.5}},
        {"concurrency": 1, "variant": "budget", "vs_best_static": cell, "vs_per_class": cell},
    ]
    (tmp_path / "floor_budget.json").write_text(json.dumps({"versus": versus}))
    measured = compare_verify(_budget_twin(), tmp_path)
    assert measured["source"] == "bench/results/floor_budget.json"
    assert measured["rows"][0]["real_vs_best_static"] == cell
    assert measured["rows"][1]["real_vs_per_class"] is None  # c4 not in the real run


def test_report_renders_from_a_json_round_trip(tmp_path: Any) -> None:
    settle = [
        {"stretch": "start", "start": 0, "classes": {"a": 1}},
        {"stretch": "shift", "start": 5, "classes": {"a": 2}},
    ]
    ratios = seed_ratios(MODES, 2)
    cell = {
        "seeds": {"1": MODES},
        "tokens_per_s": {m: {"median": f["tokens_per_s"]} for m, f in MODES.items()},
        "ratios": {n: {"min": v, "median": v, "max": v} for n, v in ratios.items()},
        "best_static": {"1": "static-k1"},
        "worst_class": {"1": {"adaptive": "b"}},
        "settle": {"1": {"adaptive": settle}},
    }
    summary = {
        "meta": {"seeds": [1]},
        "profiles": {
            "p": {
                "workload": "w",
                "max_k": 2,
                "requests_per_run": 10,
                "profile_source": "s",
                "workload_source": "t",
                "arrivals": {"c4": cell},
                "checks": checks({"c4": cell}),
            }
        },
    }
    text = render(json.loads(json.dumps(summary, sort_keys=True)))
    assert "| shift / a | 2 |" in text
    assert "| c4: adaptive / best static | 1.050 | >= 1.00 | pass |" in text
    assert "start / a" not in text
    assert "| p | c4 | 1.050 | 1.050 | 1.050 | 1.008 | 1.008 | 1.008 |" in text
    # the trade-off: adaptive is ahead of the best static depth but its class b reads 0.98
    # of no speculation; static k = 1, the threshold baseline and the oracle meet both
    # targets here
    assert "| nospec | 0.833 · 1.00 |" in text
    assert "| static-k1 | 1.000 · 1.10 |" in text
    assert "| trtllm-threshold | 1.008 · 1.10 |" in text
    assert "| adaptive | 1.050 · 0.98 |" in text
    assert "| both met by | static-k1, trtllm-threshold, oracle |" in text
    assert "| upper-bound |" not in text  # it did not run
