"""Every setting once: its YAML path, its flag, its environment names, default and help.

`serve --help` prints this list; the tests check that each flag parses and each name is
read. Derived from the models' fields, so a new field is listed without another edit.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from gateway.config.environment import ENV_PREFIX, SECTION_ENV, shared_keys
from gateway.config.model import ServeSettings


@dataclass(frozen=True)
class SettingDoc:
    """One leaf setting as an operator sets it."""

    path: tuple[str, ...]
    env: tuple[str, ...]
    default: Any
    description: str
    secret: bool

    @property
    def key(self) -> str:
        """The YAML path, dotted: `engine.max_depth`."""
        return ".".join(self.path)

    @property
    def flag(self) -> str:
        """`--engine.max-depth`: the path in kebab case, as `CliSettingsSource` spells it."""
        return "--" + ".".join(part.replace("_", "-") for part in self.path)


def setting_docs(root: type[BaseModel] = ServeSettings) -> list[SettingDoc]:
    """Leaves of the settings tree in field order (sections' shared keys left out)."""
    return list(_walk(root, ()))


def _walk(model: type[BaseModel], path: tuple[str, ...]) -> Iterator[SettingDoc]:
    hidden = shared_keys(ServeSettings).get(path[0], ()) if len(path) == 1 else ()
    for name, info in model.model_fields.items():
        if name in hidden:
            continue
        nested = _model_of(info.annotation)
        if nested is not None:
            yield from _walk(nested, (*path, name))
        else:
            yield _leaf((*path, name), info)


def _leaf(path: tuple[str, ...], info: FieldInfo) -> SettingDoc:
    return SettingDoc(
        path=path,
        env=env_names(path),
        default=info.get_default(call_default_factory=True),
        description=info.description or "",
        secret=SecretStr in (info.annotation, *get_args(info.annotation)),
    )


def env_names(path: tuple[str, ...]) -> tuple[str, ...]:
    """The variable that sets `path`; a key nested deeper than a section is set by its
    top-level block as JSON (`SPECGW_TENANTS`)."""
    if len(path) == 1:
        return (f"{ENV_PREFIX}{path[0]}".upper(),)
    if len(path) == 2 and path[0] in SECTION_ENV:
        return (f"{SECTION_ENV[path[0]]}{path[1]}".upper(),)
    return (f"{ENV_PREFIX}{path[0]}".upper(),)


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if get_origin(annotation) in (Union, types.UnionType):
        return None  # an optional block is a value of its own, not a section
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None
