"""Where `spec-gateway serve` settings come from: flags, the environment, the YAML file.

Three pydantic-settings sources, in this order of precedence (the first that sets a key
wins; nested sections merge key by key):

1. flags: `CliSettingsSource` over the whole settings tree, one flag per setting with its
   YAML path in kebab case (`--max-running`, `--engine.max-depth`, `--control.hysteresis`);
   the short `serve` options (`--host`, `--max-depth`, ...) are spelt into the same flags.
2. the environment: `SPECGW_<KEY>` at the top level and `SPECGW_<SECTION>_<KEY>` in a
   section (`SPECGW_ENGINE_MAX_DEPTH`, `SPECGW_CONTROL_HYSTERESIS`, `SPECGW_FLAGS_...`,
   `SPECGW_STATE_...`). The bare `SPECGW_<KEY>` names the flags and state sections read
   before they were sections are refused, each with the name to use
   (`gateway.config.environment`). A nested block (`tenants`) takes JSON under its
   top-level name (`SPECGW_TENANTS`).
3. the YAML file `config_file` names (`--config`, `SPECGW_CONFIG_FILE`): gateway keys at
   the top level, one mapping per section (`engine:`, `control:`, `flags:`, `state:`,
   `tenants:`), read by `YamlConfigSettingsSource`.

Nothing reads the environment or a file at import: the sources run when the settings are
built (`gateway.config.resolve`).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    CliSettingsSource,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    YamlConfigSettingsSource,
)

from gateway.config.environment import (
    ENV_PREFIX,
    SECTION_ENV,
    legacy_refusals,
    section_model,
    shared_keys,
)
from gateway.config.errors import ConfigError


class SectionedEnvSource(PydanticBaseSettingsSource):
    """`SPECGW_*` for the top level, each section's own prefix for its keys.

    A section's model is a `BaseSettings` too and reads its own prefix again when it is
    built, but only for keys no source gave it: the engine's and the controller's names
    are those read here, and the bare `SPECGW_<KEY>` names the flags and state models read
    are refused here first (a shared one is the top level's and is copied over), so the
    two cannot disagree, and a file's value never beats the environment.
    """

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads whole models, not single fields

    def __call__(self) -> dict[str, Any]:
        refused = legacy_refusals(os.environ, self.settings_cls)
        if refused:
            raise ConfigError(refused)
        values: dict[str, Any] = EnvSettingsSource(self.settings_cls, env_prefix=ENV_PREFIX)()
        shared = shared_keys(self.settings_cls)
        for section, prefix in SECTION_ENV.items():
            if section not in self.settings_cls.model_fields:
                continue
            model = section_model(self.settings_cls, section)
            found: dict[str, Any] = EnvSettingsSource(model, env_prefix=prefix)()
            for key in shared.get(section, ()):
                found.pop(key, None)  # the top level's (`SPECGW_REDIS_URL` is `redis_url`)
            if found:
                values[section] = {**(values.get(section) or {}), **found}
        return values


class ConfigFileSource(YamlConfigSettingsSource):
    """The YAML file named by `config_file`, as flags or the environment set it.

    The file is read when the source runs, after the flags and the environment (it is
    the lowest source), so `--config` and `SPECGW_CONFIG_FILE` both name it. A missing
    file or a file that is not a mapping is an error, not an empty configuration.
    """

    def __init__(self, settings_cls: type[BaseSettings]) -> None:
        super().__init__(settings_cls, yaml_file=None)

    def __call__(self) -> dict[str, Any]:
        named = self.current_state.get("config_file")
        if named is None:
            return {}
        path = Path(named)
        if not path.is_file():
            raise ConfigError([f"config_file: {path}: no such file"])
        loaded: Any = self._read_file(path)
        if not isinstance(loaded, dict):
            raise ConfigError([f"{path}: expected a mapping of settings at the top level"])
        if "config_file" in loaded:
            raise ConfigError([f"{path}: config_file: names this file, set it with --config"])
        return loaded


def cli_source(settings_cls: type[BaseSettings], args: Sequence[str]) -> CliSettingsSource[Any]:
    """One flag per setting, parsed from `args`; an unknown flag is a `ConfigError`.

    Abbreviations are off (`--max-run` must not mean `--max-running`); values are parsed
    and bounded by the model, as the environment's and the file's are.
    """
    parser = argparse.ArgumentParser(
        prog="spec-gateway serve", allow_abbrev=False, add_help=False, exit_on_error=False
    )
    source = CliSettingsSource[Any](
        settings_cls,
        root_parser=parser,
        cli_kebab_case=True,
        cli_avoid_json=True,
        cli_implicit_flags=False,
        cli_exit_on_error=False,
        cli_prog_name="spec-gateway serve",
    )
    known = {name for action in parser._actions for name in action.option_strings}
    unknown = [
        arg.split("=", 1)[0]
        for arg in args
        if arg.startswith("--") and arg.split("=", 1)[0] not in known
    ]
    if unknown:
        from gateway.config.errors import suggestion

        raise ConfigError(
            [f"{flag}: unknown setting{suggestion(flag, sorted(known))}" for flag in unknown]
        )
    try:
        source(args=list(args))
    except Exception as exc:  # argparse's complaint (a flag without its value), one line
        raise ConfigError([str(exc).splitlines()[0]]) from None
    return source
