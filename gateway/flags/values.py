"""The ops flags: names, types, bounds, defaults, and the resolved per-class view.

| flag                  | type  | meaning                                                       |
|-----------------------|-------|---------------------------------------------------------------|
| `speculation-enabled` | bool  | global kill switch: false = every request runs at k = 0       |
| `controller-mode`     | str   | `adaptive`; `static` (default k); `shadow` (decide and record, |
|                       |       | apply the static default)                                      |
| `pin-k`               | int   | fixed k for the targeted class; -1 = no pin; 0 = no speculation|
| `k-min`, `k-max`      | int   | bounds on the k the controller may choose                      |
| `exploration-share`   | float | share of requests that probe a k other than the best, 0..1     |
| `batch-floor`         | float | the targeted class's requests in flight may not be slowed below |
|                       |       | this share of their speed at k = 0 by a deeper request joining  |
|                       |       | their batch, and one entering a deeper batch lowers the requests |
|                       |       | already there to what it can afford; 0 = off (the batch's tokens |
|                       |       | per step decide alone); unset, the engine's default             |
|                       |       | (`ControllerSettings.batch_floor_for`)                          |
| `batch-ride`          | bool  | a request whose class chose less than the depth a request in    |
|                       |       | flight chose runs at that depth (it pays for it anyway); false =|
|                       |       | at its class's k; ignored where `batch-floor` is set            |
| `batch-lower`         | bool  | a request entering a batch deeper than it runs lowers the       |
|                       |       | requests in flight to the depth where the batch's tokens per    |
|                       |       | unit of step cost are highest; false = they keep their depth    |
|                       |       | until they finish; ignored where `batch-floor` is set           |

Per-class values come from OpenFeature evaluation contexts carrying the
attributes `class` (class id) and `label`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, cast

ControllerMode = Literal["adaptive", "static", "shadow"]
CONTROLLER_MODES: tuple[ControllerMode, ...] = ("adaptive", "static", "shadow")
FlagValue = bool | str | int | float
MAX_K = 64


@dataclass(frozen=True, slots=True)
class FlagValues:
    """Resolved flags for one class; the lead maps this to the controller's overrides.

    A pin wins over the bounds (an operator's explicit choice, "pin 0" included);
    the controller still clamps every k to the engine's maximum depth.
    """

    enabled: bool = True
    mode: ControllerMode = "adaptive"
    pin_k: int | None = None
    k_min: int = 0
    k_max: int = 16
    exploration_share: float = 0.05
    batch_floor: float = 0.0
    batch_ride: bool = True
    batch_lower: bool = True


@dataclass(frozen=True, slots=True)
class FlagSpec:
    key: str
    kind: type
    field: str
    check: Callable[[FlagValue], bool]
    help: str


def _int_in(lo: int, hi: int) -> Callable[[FlagValue], bool]:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


SPECS: dict[str, FlagSpec] = {
    spec.key: spec
    for spec in (
        FlagSpec(
            "speculation-enabled",
            bool,
            "enabled",
            lambda v: isinstance(v, bool),
            "kill switch: false = k 0 for every request",
        ),
        FlagSpec(
            "controller-mode",
            str,
            "mode",
            lambda v: v in CONTROLLER_MODES,
            "adaptive | static | shadow",
        ),
        FlagSpec("pin-k", int, "pin_k", _int_in(-1, MAX_K), "fixed k for a class; -1 = no pin"),
        FlagSpec("k-min", int, "k_min", _int_in(0, MAX_K), "lowest k the controller may pick"),
        FlagSpec("k-max", int, "k_max", _int_in(0, MAX_K), "highest k the controller may pick"),
        FlagSpec(
            "exploration-share",
            float,
            "exploration_share",
            lambda v: isinstance(v, float) and 0.0 <= v <= 1.0,
            "share of requests that explore another k (0..1)",
        ),
        FlagSpec(
            "batch-floor",
            float,
            "batch_floor",
            lambda v: isinstance(v, float) and 0.0 <= v <= 1.0,
            "least share of its k = 0 speed a request in flight keeps when a deeper one "
            "joins its batch (0..1; 0 = off)",
        ),
        FlagSpec(
            "batch-ride",
            bool,
            "batch_ride",
            lambda v: isinstance(v, bool),
            "a request whose class chose less than the batch's depth runs at it "
            "(false: at its class's k)",
        ),
        FlagSpec(
            "batch-lower",
            bool,
            "batch_lower",
            lambda v: isinstance(v, bool),
            "a newcomer lowers the requests in flight to the depth the batch gains most "
            "at (false: they keep theirs)",
        ),
    )
}


class FlagValueError(ValueError):
    """Unknown flag or a value of the wrong type or out of bounds."""


def coerce(flag: str, value: FlagValue) -> FlagValue:
    """Check (and, from strings such as CLI arguments, parse) a value for `flag`."""
    spec = SPECS.get(flag)
    if spec is None:
        raise FlagValueError(f"unknown flag {flag!r}; known: {', '.join(SPECS)}")
    parsed: FlagValue = value
    if flag == "pin-k" and isinstance(value, str) and value.strip().lower() in ("none", "off"):
        parsed = -1  # `flags set pin-k none`: a bare -1 reads as an option on a command line
    elif isinstance(value, str) and spec.kind is not str:
        parsed = _parse_text(value, spec.kind)
    elif spec.kind is float and isinstance(value, int) and not isinstance(value, bool):
        parsed = float(value)
    if not spec.check(parsed):
        raise FlagValueError(f"invalid value {value!r} for {flag}: {spec.help}")
    return parsed


def _parse_text(text: str, kind: type) -> FlagValue:
    text = text.strip()
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered in ("true", "1", "on", "yes"):
                return True
            if lowered in ("false", "0", "off", "no"):
                return False
            return text
        if kind is int:
            return int(text)
        return float(text)
    except ValueError:
        return text


def to_field(flag: str, value: FlagValue) -> object:
    """A flag's value as the FlagValues field holds it (`pin-k` -1 becomes None)."""
    if flag == "pin-k":
        return None if value == -1 else value
    return value


def default_of(defaults: FlagValues, flag: str) -> FlagValue:
    value = getattr(defaults, SPECS[flag].field)
    if flag == "pin-k" and value is None:
        return -1
    return cast(FlagValue, value)
