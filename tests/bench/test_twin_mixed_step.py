"""A step mixing k = 0 and drafting requests (`Profile.mixed_step`): validated, interpolated
as documented, charged by the engine under uniform and per-request depths, and built from a
GPU or a CPU measurement."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.twin.costs import MIXED_SHARES, StepCosts
from bench.twin.engine import VirtualClock, simulate
from bench.twin.mixed_step import main as write_mixed_step
from bench.twin.mixed_step import mixed_step_of
from bench.twin.modes.static import PerRequestDepths
from bench.twin.requests import TwinRequest
from bench.twin.schema import MixedStepCost, Profile, TwinInputError, load_profile

REPO = Path(__file__).resolve().parents[2]

#: Step ms = 10 + 2 k + b as in test_twin_engine; a mixed step at batch 2 costs 0.9x the
#: uniform step at its depth at share 0.5 (depth 1) and 0.8x (depth 3), 1.05x at share 0.
BASE: dict[str, Any] = {
    "name": "linear",
    "source": "test",
    "max_k": 4,
    "batch_stats": {"1": {"0": 11.0, "4": 19.0}, "2": {"0": 12.0, "4": 20.0}},
    "no_spec_step_ms": {"1": 10.0, "2": 11.0},
    "prefill_ms_per_token": {"target": 0.1, "drafter": 0.05},
    "first_token_extra_ms": {"4": 4.0},
    "batch_depth": "uniform",
}
MIXED = {
    "source": "test table",
    "ratio": {
        "2": {"1": {"0": 1.05, "0.5": 0.9}, "3": {"0": 1.05, "0.5": 0.8}},
        "8": {"1": {"0": 1.05, "0.5": 1.0}, "3": {"0": 1.05, "0.5": 1.0}},
    },
}


def _profile(**changes: Any) -> Profile:
    return Profile.model_validate(BASE | changes)


def _request(index: int, runs: list[int]) -> TwinRequest:
    return TwinRequest(index, "c", 0, 0, 0, 10, len(runs), (1.0,) * 16, bytes(runs))


def test_the_factor_interpolates_share_depth_and_batch_and_holds_beyond_them() -> None:
    costs = StepCosts.of(_profile(mixed_step=MIXED), 16)
    # one of two at k = 0: share 0.5, a measured point
    assert costs.mixed_factor(2, 1, 1) == pytest.approx(0.9)
    assert costs.mixed_factor(2, 3, 1) == pytest.approx(0.8)
    assert costs.mixed_factor(2, 2, 1) == pytest.approx(0.85)  # between depths 1 and 3
    assert costs.mixed_factor(2, 4, 1) == pytest.approx(0.8)  # beyond depth 3: depth 3's
    # batch 5 lies halfway between 2 and 8; share 2/5 = 0.4 -> 1.05 + 0.8 (0.9 - 1.05)
    at_2 = 1.05 + (round(MIXED_SHARES * 0.4) / MIXED_SHARES / 0.5) * (0.9 - 1.05)
    at_8 = 1.05 + (round(MIXED_SHARES * 0.4) / MIXED_SHARES / 0.5) * (1.0 - 1.05)
    assert costs.mixed_factor(5, 1, 2) == pytest.approx((at_2 + at_8) / 2)
    assert costs.mixed_factor(16, 1, 12) == pytest.approx(1.0)  # share 0.75 > 0.5: held
    # a step with no k = 0 request, only k = 0 requests, or at depth 0 is not mixed
    for batch, depth, zeros in ((4, 3, 0), (4, 3, 4), (4, 0, 2)):
        assert costs.mixed_factor(batch, depth, zeros) == 1.0
    assert StepCosts.of(_profile(), 16).mixed_factor(2, 1, 1) == 1.0


@pytest.mark.parametrize("batch_depth", ["uniform", "per-request"])
def test_the_engine_charges_a_mixed_step_its_factor(batch_depth: str) -> None:
    """Requests at k = 3 and k = 0 decode together for one step (batch 2, depth 3: 18 ms
    uniform, 0.8x that mixed), then the k = 0 request alone (not mixed either way)."""
    runs = [0, 3, 0]
    requests = [_request(0, runs[:2]), _request(1, runs)]
    depths = {0: 3, 1: 0}
    makespans = {}
    for name, profile in (
        ("plain", _profile(batch_depth=batch_depth)),
        ("mixed", _profile(batch_depth=batch_depth, mixed_step=MIXED)),
    ):
        source = PerRequestDepths(lambda r: depths[r.index])
        result = simulate(requests, source, StepCosts.of(profile, 4), VirtualClock(), clients=2)
        makespans[name] = result.makespan_s
    assert makespans["plain"] - makespans["mixed"] == pytest.approx(0.2 * 18.0 / 1000)


def test_a_mixed_step_table_needs_valid_shares(tmp_path: Path) -> None:
    bad = {
        "share 1": BASE | {"mixed_step": MIXED | {"ratio": {"2": {"1": {"1.0": 0.9}}}}},
        "batch 1": BASE | {"mixed_step": MIXED | {"ratio": {"1": {"1": {"0": 1.0}}}}},
        "ratio 0": BASE | {"mixed_step": MIXED | {"ratio": {"2": {"1": {"0": 0.0}}}}},
    }
    for name, document in bad.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document))
        with pytest.raises(TwinInputError, match=r"mixed_step"):
            load_profile(path)


def _written(measurement: dict[str, Any], profile: dict[str, Any], tmp_path: Path) -> StepCosts:
    """Write `measurement` into `profile` through the command; the result's step costs."""
    source, path = tmp_path / "m.json", tmp_path / "p.json"
    source.write_text(json.dumps(measurement))
    path.write_text(json.dumps(profile))
    write_mixed_step(source, [path])
    return StepCosts.of(load_profile(path), 8)


def test_a_gpu_pieces_measurement_becomes_the_profiles_table(tmp_path: Path) -> None:
    measurement = {
        "source": "measured by python -m bench.twin.gpu_pieces on a GPU",
        "rows": [
            {"batch": 4, "k": 1, "zero": 0, "piecewise_over_uniform": 1.03},
            {"batch": 4, "k": 1, "zero": 1, "piecewise_over_uniform": 1.01},
            {"batch": 4, "k": 3, "zero": 3, "piecewise_over_uniform": 0.9},
        ],
    }
    block = mixed_step_of(measurement, "m.json")
    assert block["ratio"] == {"4": {"1": {"0.0": 1.03, "0.25": 1.01}, "3": {"0.75": 0.9}}}
    assert "m.json" in block["source"]
    source = tmp_path / "m.json"
    assert _written(measurement, BASE, tmp_path).mixed_factor(4, 3, 3) == pytest.approx(0.9)
    png = tmp_path / "ratios.png"
    write_mixed_step(source, None, png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_cpu_measurement_becomes_a_per_request_profiles_table(tmp_path: Path) -> None:
    measurement = {
        "source": "measured by python -m bench.mixed_step_cpu on a CPU",
        "rows": [
            {"batch": 4, "k": 2, "zero": 0, "mixed_over_uniform": 1.0},
            {"batch": 4, "k": 2, "zero": 2, "mixed_over_uniform": 0.7},
        ],
    }
    block = mixed_step_of(measurement, "cpu.json")
    assert block["ratio"] == {"4": {"2": {"0.0": 1.0, "0.5": 0.7}}}
    assert "python -m bench.mixed_step_cpu" in block["source"]
    costs = _written(measurement, BASE | {"batch_depth": "per-request"}, tmp_path)
    assert costs.mixed_factor(4, 2, 2) == pytest.approx(0.7)
    # rows without one ratio field of a known measurement are refused
    with pytest.raises(ValueError, match="ratio field"):
        mixed_step_of({"source": "x", "rows": [{"batch": 4, "k": 2, "zero": 1}]}, "x.json")


@pytest.mark.parametrize(
    "name",
    [
        "measured-h100-llama8b-eagle3",
        "h100-llama8b-eagle3",
        "measured-h100-qwen3-30b-a3b-eagle3",
        "moe-30b-a3b",
        "kimi-k2.6-eagle31",
    ],
)
def test_the_gpu_profiles_carry_the_measured_table(name: str) -> None:
    """Each shipped GPU profile prices mixed steps from a committed gpu_pieces run; the
    published ones say whose measurement they borrow."""
    profile = load_profile(REPO / "bench" / "twin" / "profiles" / f"{name}.json")
    assert profile.mixed_step is not None
    assert "gpu_pieces" in profile.mixed_step.source
    assert name.startswith("measured") or profile.mixed_step.source.startswith("borrowed")
    path = profile.mixed_step.source.split("(")[-1].split(";")[0]
    measured = mixed_step_of(json.loads((REPO / path).read_text()), path)
    assert MixedStepCost.model_validate(measured).ratio == profile.mixed_step.ratio
    assert StepCosts.of(profile, 64).mixed is not None


def test_the_cpu_profile_carries_the_cpu_engines_measured_table() -> None:
    """`cpu-embedded` prices a mixed step from the committed `bench.mixed_step_cpu` run on the
    real CPU engine, under its own per-request depths."""
    profile = load_profile(REPO / "bench" / "twin" / "profiles" / "cpu-embedded.json")
    assert profile.batch_depth == "per-request"
    assert profile.mixed_step is not None
    assert "bench.mixed_step_cpu" in profile.mixed_step.source
    path = profile.mixed_step.source.split("(")[-1].split(";")[0]
    measured = mixed_step_of(json.loads((REPO / path).read_text()), path)
    assert MixedStepCost.model_validate(measured).ratio == profile.mixed_step.ratio
