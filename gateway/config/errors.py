"""A configuration mistake as one line per offending key: `engine.max_depht: unknown setting
(did you mean max_depth?)`.

pydantic reports where an error is as a location tuple; the path an operator writes in the
YAML file is that tuple joined with dots. An unknown key gets the nearest known key at the
same place (`difflib.get_close_matches`, ratio >= 0.6), which catches transpositions and
one-letter slips without guessing wildly.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Sequence
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """Settings that must not start a gateway; `lines` name each offending key."""

    def __init__(self, lines: Sequence[str]) -> None:
        super().__init__("; ".join(lines))
        self.lines = list(lines)


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name nearest to `name`, or None when none is near enough."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return close[0] if close else None


def suggestion(name: str, known: Iterable[str]) -> str:
    """` (did you mean X?)` for the closest known name, or nothing."""
    near = closest(name, known)
    return f" (did you mean {near}?)" if near else ""


def describe(error: ValidationError, root: type[BaseModel]) -> ConfigError:
    """Each of pydantic's errors as `path: what is wrong` (value errors lose their prefix).

    The refused value is quoted, except under the root's `UNECHOED` paths, where it may be
    a secret (a plaintext API key where a digest belongs)."""
    lines: list[str] = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        path = ".".join(str(part) for part in loc)
        if item["type"] == "extra_forbidden":
            message = "unknown setting" + suggestion(str(loc[-1]), known_keys(root, loc[:-1]))
        else:
            message = str(item["msg"]).removeprefix("Value error, ")
            echo = bool(loc) and not _secret(root, loc)
            if echo and "input" in item and not isinstance(item["input"], dict | list):
                message += f" (got {item['input']!r})"
        lines.append(f"{path}: {message}" if path else message)
    return ConfigError(lines)


def _secret(root: type[BaseModel], loc: Sequence[Any]) -> bool:
    paths: Sequence[tuple[str, ...]] = getattr(root, "UNECHOED", ())
    parts = tuple(str(part) for part in loc)
    return any(parts[: len(path)] == path for path in paths)


def known_keys(root: type[BaseModel], loc: Sequence[Any]) -> list[str]:
    """The keys the model accepts at `loc` (a mapping's key or a list's index is skipped)."""
    current: Any = root
    skip = 0
    for part in loc:
        if skip:
            skip -= 1
            continue
        model = _model_in(current)
        field = model.model_fields.get(str(part)) if model is not None else None
        if field is None:
            return []
        current = field.annotation
        while get_origin(_strip_optional(current)) in (dict, list):
            args = get_args(_strip_optional(current))
            current = args[-1] if args else Any
            skip += 1  # the next part of `loc` is the mapping's key or the list's index
    model = _model_in(current)
    if model is None:
        return []
    shared: dict[str, tuple[str, ...]] = getattr(root, "SHARED_KEYS", {})
    hidden = set(shared.get(str(loc[-1]), ())) if loc and len(loc) == 1 else set()
    return [name for name in model.model_fields if name not in hidden]


def _strip_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _model_in(annotation: Any) -> type[BaseModel] | None:
    inner = _strip_optional(annotation)
    if isinstance(inner, type) and issubclass(inner, BaseModel):
        return inner
    return None
