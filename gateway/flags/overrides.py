"""How runtime flag overrides are laid out in Redis, shared by the provider and the admin.

One hash holds every override: field `<flag>` for all classes, `<flag>|class=<id>`
or `<flag>|label=<label>` for a target; the value is JSON. A version counter is
incremented and a message published on each change, so replicas refresh at once
(pub/sub) or on their next poll of the version (fallback when a message is lost).
Precedence when resolving for a class: class target > label target > global.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from gateway.flags.values import FlagValue

TargetKind = Literal["class", "label"]


@dataclass(frozen=True, slots=True)
class OverrideKeys:
    hash: str
    version: str
    channel: str
    audit: str

    @classmethod
    def for_prefix(cls, prefix: str) -> OverrideKeys:
        return cls(
            hash=f"{prefix}:flags",
            version=f"{prefix}:flags:version",
            channel=f"{prefix}:flags:changed",
            audit=f"{prefix}:flags:audit",
        )


@dataclass(frozen=True, slots=True)
class Target:
    """Which requests an override applies to: all (kind None), a class id or a label."""

    kind: TargetKind | None = None
    value: str = ""

    def __post_init__(self) -> None:
        if (self.kind is None) != (self.value == ""):
            raise ValueError("a target names both a kind and a value, or neither")
        if "|" in self.value or "=" in self.value:
            raise ValueError("a target value may not contain '|' or '='")

    @classmethod
    def of(cls, class_id: str | None = None, label: str | None = None) -> Target:
        if class_id and label:
            raise ValueError("target a class or a label, not both")
        if class_id:
            return cls("class", class_id)
        if label:
            return cls("label", label)
        return cls()

    def describe(self) -> str:
        return "all" if self.kind is None else f"{self.kind}={self.value}"


def field_name(flag: str, target: Target) -> str:
    return flag if target.kind is None else f"{flag}|{target.kind}={target.value}"


def parse_field(field: str) -> tuple[str, Target]:
    flag, _, rest = field.partition("|")
    if not rest:
        return flag, Target()
    kind, _, value = rest.partition("=")
    if kind not in ("class", "label"):
        raise ValueError(f"bad override field {field!r}")
    return flag, Target(kind, value)  # type: ignore[arg-type]


def candidate_fields(flag: str, class_id: str | None, label: str | None) -> list[str]:
    out = []
    if class_id:
        out.append(f"{flag}|class={class_id}")
    if label:
        out.append(f"{flag}|label={label}")
    out.append(flag)
    return out


def encode(value: FlagValue) -> str:
    return json.dumps(value)


def decode(raw: str) -> FlagValue:
    value = json.loads(raw)
    if not isinstance(value, bool | str | int | float):
        raise ValueError(f"override value must be a scalar, got {raw!r}")
    return value
