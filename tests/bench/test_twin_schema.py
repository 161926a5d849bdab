"""The twin's input files: interpolation of step costs, and one-line errors naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.twin.schema import Profile, TwinInputError, load_profile, load_workload

FIXTURES = Path(__file__).parent / "twin_fixtures"


def _profile(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "p",
        "source": "test",
        "max_k": 7,
        "batch_stats": {
            "1": {"0": 6.0, "1": 7.0, "3": 9.0},
            "16": {"0": 8.0, "1": 10.0, "3": 14.0},
        },
        "prefill_ms_per_token": {"target": 0.05, "drafter": 0.01},
        "first_token_extra_ms": {"1": 1.0, "3": 2.0},
    }
    base.update(changes)
    return base


def _workload(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "w",
        "source": "test",
        "classes": {
            "chat": {
                "request": {"messages": [{"role": "user", "content": "hi"}]},
                "acceptance": [0.8, 0.7],
                "prompt_tokens": {"dist": "fixed", "value": 100},
                "output_tokens": {"dist": "uniform", "low": 10, "high": 20},
            }
        },
        "phases": [{"name": "one", "requests": 10, "mix": {"chat": 1.0}}],
        "arrivals": [{"kind": "closed", "concurrency": 4}],
    }
    base.update(changes)
    return base


@pytest.mark.parametrize(
    ("batch", "k", "expected_ms"),
    [
        (1, 0, 6.0),  # measured
        (1, 2, 8.0),  # between k = 1 and 3
        (1, 5, 11.0),  # beyond k = 3: the slope of k = 1..3 (1 ms per k)
        (16, 3, 14.0),  # measured
        (8.5, 0, 7.0),  # halfway from batch 1 to 16
        (31, 1, 13.0),  # beyond batch 16: the slope of 1..16 at k = 1 (3 ms over 15)
    ],
)
def test_step_ms_interpolates_in_k_then_batch(batch: float, k: int, expected_ms: float) -> None:
    profile = Profile.model_validate(_profile())
    assert profile.step_ms(batch, k) == pytest.approx(expected_ms)  # type: ignore[arg-type]


def test_extrapolation_never_falls_below_the_last_measured_value() -> None:
    profile = Profile.model_validate(
        _profile(batch_stats={"1": {"0": 6.0, "1": 7.0}, "16": {"0": 5.0, "1": 6.5}})
    )
    assert profile.step_ms(64, 0) == pytest.approx(5.0)
    assert profile.step_ms(64, 1) == pytest.approx(6.5)


def test_no_spec_defaults_to_the_speculative_engine_at_k0() -> None:
    profile = Profile.model_validate(_profile())
    assert profile.no_spec_ms(16) == pytest.approx(8.0)
    with_own = Profile.model_validate(_profile(no_spec_step_ms={"1": 5.5, "16": 7.0}))
    assert with_own.no_spec_ms(1) == pytest.approx(5.5)
    assert with_own.no_spec_ms(31) == pytest.approx(8.5)


@pytest.mark.parametrize(("k", "expected_ms"), [(0, 0.0), (1, 1.0), (2, 1.5), (3, 2.0), (5, 3.0)])
def test_first_token_extra_interpolates_from_zero(k: int, expected_ms: float) -> None:
    profile = Profile.model_validate(_profile())
    assert profile.first_token_extra(k) == pytest.approx(expected_ms)


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"batch_stats": {"2": {"0": 6.0}}}, "batch_stats: batch size 1 must be measured"),
        ({"batch_stats": {"1": {"1": 6.0}}}, "k = 0 must be measured"),
        ({"batch_stats": {"1": {"0": "fast"}}}, "batch_stats.1.0"),
        ({"batch_stats": {"1": {"0": -1.0}}}, "step time must be > 0"),
        ({"max_k": 0}, "max_k: Input should be greater than or equal to 1"),
        ({"prefill_ms_per_token": {"target": 0.1}}, "prefill_ms_per_token.drafter: Field required"),
        ({"colour": "blue"}, "colour: Extra inputs are not permitted"),
        ({"acceptance_rate_per_pos": [0.5, 1.5]}, "acceptance_rate_per_pos.1"),
    ],
)
def test_profile_errors_name_the_file_and_the_field(
    tmp_path: Path, changes: dict[str, Any], fragment: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_profile(**changes)))
    with pytest.raises(TwinInputError) as err:
        load_profile(path)
    message = str(err.value)
    assert message.startswith(f"{path}: ")
    assert "\n" not in message
    assert fragment in message


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"phases": [{"name": "x", "requests": 5, "mix": {"chat": 0.7}}]}, "sum to 0.7, not 1"),
        (
            {"phases": [{"name": "x", "requests": 5, "mix": {"chat": 0.5, "code": 0.5}}]},
            "phases.0.mix.code: unknown class 'code'",
        ),
        (
            {
                "phases": [
                    {
                        "name": "x",
                        "requests": 5,
                        "mix": {"chat": 1.0},
                        "shifts": [{"class": "tools", "after": 0.5, "acceptance_scale": 0.7}],
                    }
                ]
            },
            "phases.0.shifts.0.class: unknown class 'tools'",
        ),
        ({"arrivals": [{"kind": "closed"}]}, "arrivals.0.closed.concurrency: Field required"),
        ({"arrivals": [{"kind": "burst"}]}, "arrivals.0: Input tag 'burst'"),
        (
            {"arrivals": [{"kind": "closed", "concurrency": 4}] * 2},
            "arrivals repeat: c4, c4",
        ),
        ({"phases": []}, "phases: List should have at least 1 item"),
    ],
)
def test_workload_errors_name_the_file_and_the_field(
    tmp_path: Path, changes: dict[str, Any], fragment: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_workload(**changes)))
    with pytest.raises(TwinInputError) as err:
        load_workload(path)
    assert str(err.value).startswith(f"{path}: ")
    assert fragment in str(err.value)


@pytest.mark.parametrize(
    ("class_changes", "fragment"),
    [
        ({"acceptance": []}, "classes.chat.acceptance: List should have at least 1 item"),
        ({"acceptance": [1.2]}, "classes.chat.acceptance.0"),
        ({"endpoint": "completions"}, "needs a `prompt` string"),
        ({"output_tokens": {"dist": "uniform", "low": 20, "high": 10}}, "high must be >= low"),
        ({"prompt_tokens": {"dist": "zipf"}}, "classes.chat.prompt_tokens: Input tag 'zipf'"),
        ({"temperature": -1}, "classes.chat.temperature"),
    ],
)
def test_class_errors_name_the_field(
    tmp_path: Path, class_changes: dict[str, Any], fragment: str
) -> None:
    workload = _workload()
    workload["classes"]["chat"].update(class_changes)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(workload))
    with pytest.raises(TwinInputError, match=r"bad\.json: ") as err:
        load_workload(path)
    assert fragment in str(err.value)


def test_unreadable_and_malformed_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(TwinInputError, match="cannot read"):
        load_profile(tmp_path / "missing.json")
    bad = tmp_path / "broken.json"
    bad.write_text("{")
    with pytest.raises(TwinInputError, match=r"broken\.json: not JSON"):
        load_workload(bad)


def test_fixtures_validate() -> None:
    assert load_profile(FIXTURES / "profile_small.json").max_k == 5
    assert load_workload(FIXTURES / "workload_small.json").total_requests == 80
