"""The pure parts of `bench.confidence`: the labels, AUC, reliability bins, the logistic
fits, the files and the hook's bookkeeping (`engine.vllm.draft_confidence.ConfidenceLog`,
driven step by step as the runner drives it). No engine starts."""

from __future__ import annotations

import gzip
import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from bench import confidence
from bench.confidence_stats import (
    CALIBRATION_SCHEMA,
    Labelled,
    auc,
    binormal_d,
    calibration_error,
    conditional,
    fit_logistic,
    position_fit,
    reliability,
    shared_fit,
    sigmoid,
    summarise,
    survival,
    wilson,
)
from engine.vllm.draft_confidence import ConfidenceLog, Drafted, VerifiedDrafts


def _records(n: int, slope: float, bias: float, k: int = 4, seed: int = 0) -> list[VerifiedDrafts]:
    """Steps whose drafts are accepted with probability sigmoid(slope * f + bias), f ~ N(1, 2),
    the chain stopping at the first rejection; every draft verified."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        feats = tuple(rng.gauss(1.0, 2.0) for _ in range(k))
        accepted = 0
        for f in feats:
            if rng.random() >= 1 / (1 + math.exp(-(slope * f + bias))):
                break
            accepted += 1
        out.append(VerifiedDrafts(str(i), feats, k, accepted))
    return out


def test_conditional_labels_the_accepted_drafts_and_the_first_rejected_one() -> None:
    r = VerifiedDrafts("a", (1.0, 2.0, 3.0, 4.0), verified=3, accepted=1)
    cond = conditional([r])
    assert cond.score.tolist() == [1.0, 2.0]  # position 2 is never reached, 3 not verified
    assert cond.position.tolist() == [0, 1]
    assert cond.label.tolist() == [True, False]
    all_accepted = conditional([VerifiedDrafts("b", (1.0, 2.0, 3.0), verified=2, accepted=2)])
    assert all_accepted.label.tolist() == [True, True]


def test_survival_scores_the_running_product_of_every_verified_draft() -> None:
    r = VerifiedDrafts("a", (0.0, 0.0, 0.0), verified=3, accepted=1)
    surv = survival([r])
    assert surv.score.tolist() == pytest.approx([0.5, 0.25, 0.125])
    assert surv.label.tolist() == [True, False, False]


def test_auc_is_the_mann_whitney_probability_with_ties_one_half() -> None:
    label = np.array([True, True, False, False])
    assert auc(np.array([3.0, 4.0, 1.0, 2.0]), label) == 1.0
    assert auc(np.array([1.0, 2.0, 3.0, 4.0]), label) == 0.0
    assert auc(np.array([1.0, 1.0, 1.0, 1.0]), label) == 0.5
    # one accepted (2) against rejected 1, 2, 3: wins 1, ties 1, loses 1
    assert auc(np.array([2.0, 1.0, 2.0, 3.0]), np.array([True, False, False, False])) == 0.5
    assert auc(np.array([1.0, 2.0]), np.array([True, True])) is None


def test_binormal_d_inverts_the_equal_variance_auc() -> None:
    assert binormal_d(0.5) == pytest.approx(0.0)
    d = binormal_d(0.76)
    assert d is not None
    # AUC = Phi(d / sqrt 2)
    assert 0.5 * (1 + math.erf(d / 2)) == pytest.approx(0.76)
    assert binormal_d(None) is None


def test_reliability_bins_count_predicted_and_observed() -> None:
    q = np.array([0.05, 0.05, 0.95, 0.95, 0.95, 1.0])
    label = np.array([False, True, True, True, False, True])
    bins = reliability(q, label)
    assert [(b["lo"], b["n"]) for b in bins] == [(0.0, 2), (0.9, 4)]  # q = 1 in the last bin
    assert bins[0]["observed"] == 0.5
    assert bins[1]["observed"] == 0.75
    assert bins[1]["predicted"] == pytest.approx(0.9625)
    lo, hi = bins[1]["observed_95"]
    assert lo < 0.75 < hi
    assert calibration_error(bins) == pytest.approx((2 * 0.45 + 4 * 0.2125) / 6, abs=1e-4)


def test_wilson_interval_stays_inside_zero_one() -> None:
    assert wilson(0, 10)[0] == 0.0
    assert wilson(10, 10)[1] == pytest.approx(1.0)
    lo, hi = wilson(50, 100)
    assert lo == pytest.approx(0.404, abs=1e-3)
    assert hi == pytest.approx(0.596, abs=1e-3)


def test_the_logistic_fit_recovers_the_link_it_was_drawn_from() -> None:
    rng = np.random.default_rng(0)
    f = rng.normal(1.0, 2.0, 20_000)
    y = rng.random(f.size) < sigmoid(0.7 * f - 0.4)
    fit = position_fit(Labelled(f, np.zeros(f.size, dtype=np.int64), y))
    assert fit is not None
    assert fit[0] == pytest.approx(0.7, abs=0.05)
    assert fit[1] == pytest.approx(-0.4, abs=0.05)


def test_the_shared_fit_has_one_slope_and_a_bias_per_position() -> None:
    records = _records(6000, slope=0.8, bias=0.3, k=3)
    fit = shared_fit(conditional(records), 3)
    assert fit is not None
    slope, biases = fit
    assert slope == pytest.approx(0.8, abs=0.1)
    assert biases == pytest.approx([0.3, 0.3, 0.3], abs=0.15)


def test_the_ridge_keeps_separable_data_finite() -> None:
    f = np.array([-2.0, -1.0, 1.0, 2.0])
    beta = fit_logistic(np.column_stack([f, np.ones(4)]), f > 0)
    assert np.all(np.isfinite(beta))
    assert beta[0] > 0


def test_an_informative_drafter_scores_an_auc_above_one_half_and_noise_does_not() -> None:
    informative = summarise(_records(3000, slope=1.0, bias=0.0), 4)
    noise = summarise(_records(3000, slope=0.0, bias=0.5), 4)
    assert informative["conditional"]["auc"] > 0.75
    assert abs(noise["conditional"]["auc"] - 0.5) < 0.03
    assert informative["survival"]["auc"] > 0.75
    rows = informative["positions"]
    assert [r["position"] for r in rows] == [0, 1, 2, 3]
    assert rows[0]["n"] == 3000  # every step observes its first draft
    assert rows[0]["n"] > rows[1]["n"] > rows[3]["n"]  # then only survivors
    assert rows[0]["log_odds_accepted"]["mean"] > rows[0]["log_odds_rejected"]["mean"]


def test_summary_counts_and_acceptance_length() -> None:
    records = [
        VerifiedDrafts("a", (1.0, 1.0, 1.0), verified=3, accepted=2),
        VerifiedDrafts("a", (1.0, 1.0, 1.0), verified=2, accepted=0),
    ]
    s = summarise(records, 3)
    assert (s["verify_steps"], s["drafted"], s["verified"], s["accepted"]) == (2, 6, 5, 2)
    assert s["acceptance_length"] == 2.0
    assert s["conditional"]["n"] == 4  # 3 from the first step, 1 from the second
    assert s["survival"]["n"] == 5


def _log_with(pending: dict[str, Drafted]) -> ConfidenceLog:
    log = ConfidenceLog()
    log.pending.update(pending)
    return log


def test_the_log_grades_the_verified_prefix_against_the_sampled_tokens() -> None:
    log = _log_with(
        {"a": Drafted((5, 6, 7), (1.0, 2.0, 3.0)), "b": Drafted((8, 9, 10), (0.5, 0.5, 0.5))}
    )
    # the scheduler trimmed a to 2 drafts and verifies b's 3; c is a new request
    log.verify(["a", "b", "c"], {"a": [5, 6], "b": [8, 9, 10]}, finished=[])
    assert log.pending == {}
    # a: 2 tokens sampled = 1 accepted + bonus; b: everything rejected
    log.graded({"a": 2, "b": 1, "c": 1})
    assert [r.as_row() for r in log.records] == [
        ("a", [1.0, 2.0, 3.0], 2, 1),
        ("b", [0.5, 0.5, 0.5], 3, 0),
    ]


def test_the_log_drops_drafts_the_step_does_not_verify_and_finished_requests() -> None:
    log = _log_with(
        {
            "kept": Drafted((1,), (1.0,)),
            "unverified": Drafted((2,), (1.0,)),
            "done": Drafted((3,), (1.0,)),
        }
    )
    log.verify(["unverified"], {}, finished=["done"])
    assert list(log.pending) == ["kept"]  # not scheduled this step: its drafts wait
    log.graded({"unverified": 1})
    assert not log.records


def test_the_log_counts_verified_drafts_it_did_not_see_drafted() -> None:
    log = _log_with({"a": Drafted((1, 2), (1.0, 1.0))})
    log.verify(["a"], {"a": [1, 3]}, finished=[])
    log.graded({"a": 3})
    assert log.mismatched == 1
    assert not log.records


def test_a_log_that_does_not_record_keeps_only_the_pending_drafts() -> None:
    log = ConfidenceLog(record=False)
    log.pending["a"] = Drafted((1,), (2.0,))
    log.verify(["a"], {"a": [1]}, finished=[])
    log.graded({"a": 2})
    assert not log.records


def test_rows_cross_the_rpc_as_plain_values_and_back() -> None:
    r = VerifiedDrafts("0-abc", (1.5, -0.25), verified=2, accepted=1)
    row = r.as_row()
    assert json.loads(json.dumps(row)) == ["0-abc", [1.5, -0.25], 2, 1]
    assert VerifiedDrafts.from_row(json.loads(json.dumps(row))) == r


def test_steps_number_requests_in_order_of_first_appearance() -> None:
    rows = [("7-x", [1.0], 1, 1), ("3-y", [2.0], 1, 0), ("7-x", [0.123456], 1, 0)]
    steps = confidence.to_steps(rows)
    assert steps == [(0, 1, 1, [1.0]), (1, 1, 0, [2.0]), (0, 1, 0, [0.1235])]
    assert confidence.from_steps(steps)[1] == VerifiedDrafts("1", (2.0,), 1, 0)


def test_the_files_are_written_and_regenerated_from_the_records(tmp_path: Path) -> None:
    runs: confidence.Runs = {
        "eagle3.1": {
            mode: {
                fam: confidence.to_steps([r.as_row() for r in _records(300, 1.0, 0.2, seed=s)])
                for s, fam in enumerate(("chat_main", "code"))
            }
            for mode in ("greedy", "sampled")
        }
    }
    setup = {"k": 4, "command": "python -m bench.confidence"}
    confidence.write(tmp_path / "a", runs, {"eagle3.1": {}}, setup)
    report = json.loads((tmp_path / "a" / "confidence.json").read_text())
    assert set(report["summary"]["eagle3.1"]["greedy"]) == {"chat_main", "code", "all"}
    pooled = report["summary"]["eagle3.1"]["greedy"]["all"]
    assert pooled["verify_steps"] == 600
    cal = json.loads((tmp_path / "a" / "calibration.json").read_text())
    assert cal["schema"] == CALIBRATION_SCHEMA
    entry = cal["drafters"]["eagle3.1"]["sampled"]["code"]
    assert {"auc", "binormal_d", "survival_auc", "shared_fit", "positions"} <= set(entry)
    first = entry["positions"][0]
    assert {"position", "n", "accept_rate", "auc", "slope", "bias"} <= set(first)
    assert first["slope"] == pytest.approx(1.0, abs=0.3)
    assert (tmp_path / "a" / "reliability.png").stat().st_size > 10_000
    records = tmp_path / "a" / "records.json.gz"
    confidence.main(["--from-records", str(records), "--out", str(tmp_path / "b")])
    for name in ("confidence.json", "calibration.json", "records.json.gz"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    assert json.loads(gzip.decompress(records.read_bytes()))["setup"] == setup
