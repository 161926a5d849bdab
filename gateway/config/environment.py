"""Which `SPECGW_*` variables mean something, and what to say about the others.

vLLM warns on an unknown `VLLM_*` variable and goes on (`vllm/envs.py`); so does
`spec-gateway serve` for `SPECGW_*`: a misspelt name is named, with the closest known one,
and ignored. Names are compared upper-cased, as pydantic-settings reads them.

The bare `SPECGW_<KEY>` names the flags and state sections read before they were sections
are refused instead of ignored: some set two settings at once (`SPECGW_OP_TIMEOUT_S` set
both sections' timeouts) and one set a setting an operator would not guess
(`SPECGW_MAX_CLASSES` set the Redis store's cap, not the controller's), so an operator
who set one must choose what they meant.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic_settings import BaseSettings

from gateway.config.errors import closest

ENV_PREFIX = "SPECGW_"
#: Section -> its environment prefix (`SPECGW_ENGINE_MAX_DEPTH` is `engine.max_depth`).
SECTION_ENV: dict[str, str] = {
    "engine": "SPECGW_ENGINE_",
    "control": "SPECGW_CONTROL_",
    "flags": "SPECGW_FLAGS_",
    "state": "SPECGW_STATE_",
}
#: Sections whose keys once had bare `SPECGW_<KEY>` names.
LEGACY_SECTIONS = ("flags", "state")
#: Read by the project outside the settings: the admin client, the chart's model fetcher,
#: and the test and benchmark tooling.
OTHER_KNOWN = frozenset(
    {
        "SPECGW_URL",
        "SPECGW_ADMIN_KEY",
        "SPECGW_MODELS_DIR",
        "SPECGW_TEST_MODELS",
        "SPECGW_UPDATE_GOLDEN",
        "SPECGW_LONG_TESTS",
        "SPECGW_SCHEMATHESIS_CASES",
    }
)


def section_model(settings_cls: type[BaseSettings], section: str) -> type[BaseSettings]:
    """The settings class of one section of the root model."""
    annotation = settings_cls.model_fields[section].annotation
    assert isinstance(annotation, type), section
    assert issubclass(annotation, BaseSettings), section
    return annotation


def shared_keys(settings_cls: type[BaseSettings]) -> Mapping[str, tuple[str, ...]]:
    """Section -> the keys it takes from the top level (`GatewaySettings.SHARED_KEYS`)."""
    shared: Mapping[str, tuple[str, ...]] = getattr(settings_cls, "SHARED_KEYS", {})
    return shared


def section_env(settings_cls: type[BaseSettings]) -> dict[str, str]:
    """Each variable a section reads -> its dotted setting (shared keys left out: the top
    level sets them)."""
    names: dict[str, str] = {}
    shared = shared_keys(settings_cls)
    for section, prefix in SECTION_ENV.items():
        if section not in settings_cls.model_fields:
            continue
        for key in section_model(settings_cls, section).model_fields:
            if key not in shared.get(section, ()):
                names[f"{prefix}{key}".upper()] = f"{section}.{key}"
    return names


def legacy_env(settings_cls: type[BaseSettings]) -> dict[str, list[str]]:
    """Each bare `SPECGW_<KEY>` once read by the flags or state section -> the settings it
    set then (a top-level key of the same name is the top level's, not legacy)."""
    top = {f"{ENV_PREFIX}{key}".upper() for key in settings_cls.model_fields}
    shared = shared_keys(settings_cls)
    legacy: dict[str, list[str]] = {}
    for section in LEGACY_SECTIONS:
        if section not in settings_cls.model_fields:
            continue
        for key in section_model(settings_cls, section).model_fields:
            name = f"{ENV_PREFIX}{key}".upper()
            if key not in shared.get(section, ()) and name not in top:
                legacy.setdefault(name, []).append(f"{section}.{key}")
    return legacy


def known_env(settings_cls: type[BaseSettings]) -> frozenset[str]:
    """Every `SPECGW_*` name the gateway or its tooling reads."""
    top = {f"{ENV_PREFIX}{key}".upper() for key in settings_cls.model_fields}
    return frozenset(top | set(section_env(settings_cls)) | OTHER_KNOWN)


def legacy_refusals(environ: Iterable[str], settings_cls: type[BaseSettings]) -> list[str]:
    """One line per bare legacy name set in `environ`, naming what to set instead."""
    legacy = legacy_env(settings_cls)
    lines: list[str] = []
    for given in sorted(environ):
        targets = legacy.get(given.upper())
        if targets is None:
            continue
        if given.upper() == "SPECGW_MAX_CLASSES" and "control" in settings_cls.model_fields:
            said = "state.max_classes, the Redis store's cap, not the controller's"
            instead = f"{_env_of('control.max_classes')} (the controller's cap) or " + (
                f"{_env_of('state.max_classes')} (the store's)"
            )
        else:
            said = " and ".join(targets)
            names = [_env_of(path) for path in targets]
            instead = names[0] if len(names) == 1 else f"{', '.join(names)} or both"
        lines.append(f"{given}: no longer read (it set {said}); set {instead}")
    return lines


def unknown_variables(environ: Iterable[str], settings_cls: type[BaseSettings]) -> list[str]:
    """One line per `SPECGW_*` name nothing reads, with the closest known name; values are
    never shown (a misspelt `SPECGW_API_KEYS` may hold a key)."""
    known = known_env(settings_cls) | set(legacy_env(settings_cls))
    stems = {name.removeprefix(ENV_PREFIX): name for name in known}
    lines: list[str] = []
    for given in sorted(environ):
        name = given.upper()
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        # Matched without the shared prefix, which would make any two names look alike.
        near = closest(name.removeprefix(ENV_PREFIX), sorted(stems))
        hint = f" (did you mean {stems[near]}?)" if near else ""
        lines.append(f"{given}: unknown environment variable, ignored{hint}")
    return lines


def _env_of(path: str) -> str:
    section, key = path.split(".", 1)
    return f"{SECTION_ENV[section]}{key}".upper()
