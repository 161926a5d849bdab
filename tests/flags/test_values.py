"""Flag names, types and bounds: table tests on the real coercion."""

from __future__ import annotations

import pytest

from gateway.flags import FlagValueError, coerce
from gateway.flags.overrides import Target, candidate_fields, field_name, parse_field


@pytest.mark.parametrize(
    ("flag", "given", "expected"),
    [
        ("speculation-enabled", "false", False),
        ("speculation-enabled", True, True),
        ("controller-mode", "shadow", "shadow"),
        ("pin-k", "0", 0),
        ("pin-k", -1, -1),
        ("pin-k", "none", -1),
        ("k-max", "8", 8),
        ("exploration-share", "0.25", 0.25),
        ("exploration-share", 0, 0.0),
        ("batch-floor", "0.98", 0.98),
        ("batch-floor", 0, 0.0),
    ],
)
def test_coerce_accepts(flag: str, given: object, expected: object) -> None:
    value = coerce(flag, given)  # type: ignore[arg-type]
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("flag", "given"),
    [
        ("no-such-flag", 1),
        ("speculation-enabled", "maybe"),
        ("speculation-enabled", 1),
        ("controller-mode", "fast"),
        ("pin-k", -2),
        ("pin-k", True),
        ("pin-k", 2.5),
        ("k-min", 65),
        ("exploration-share", 1.5),
        ("exploration-share", "a lot"),
        ("batch-floor", 1.2),
        ("batch-floor", -0.1),
    ],
)
def test_coerce_rejects(flag: str, given: object) -> None:
    with pytest.raises(FlagValueError):
        coerce(flag, given)  # type: ignore[arg-type]


def test_override_fields_round_trip_and_precedence() -> None:
    for target in (Target(), Target.of(class_id="c7"), Target.of(label="code")):
        assert parse_field(field_name("pin-k", target)) == ("pin-k", target)
    assert candidate_fields("pin-k", "c7", "code") == [
        "pin-k|class=c7",
        "pin-k|label=code",
        "pin-k",
    ]
    with pytest.raises(ValueError, match="not both"):
        Target.of(class_id="a", label="b")
    with pytest.raises(ValueError, match="may not contain"):
        Target.of(class_id="a|b")
