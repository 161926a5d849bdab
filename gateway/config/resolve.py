"""Build `ServeSettings` from flags, the environment and the YAML file, or say what is wrong."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_settings import SettingsError

from gateway.config.errors import ConfigError, describe
from gateway.config.model import ServeSettings
from gateway.config.sources import cli_source


def resolve(args: Sequence[str] = (), config_file: Path | None = None) -> ServeSettings:
    """The settings `spec-gateway serve` would run with, validated, or a `ConfigError`.

    `args` are setting flags (`--max-running 8`, `--engine.max-depth 2`, `--config-file
    f.yaml`); `config_file` names the YAML file below the flags and the environment (as
    `SPECGW_CONFIG_FILE` does). Nothing is started and no model is opened. A gateway that
    would refuse to bind (no API keys off loopback) is refused here too.
    """
    init: dict[str, Any] = {} if config_file is None else {"config_file": config_file}
    try:
        settings = ServeSettings(_cli_settings_source=cli_source(ServeSettings, args), **init)
    except ValidationError as exc:
        raise describe(exc, ServeSettings) from None
    except SettingsError as exc:  # a value the environment holds that is not valid JSON
        raise ConfigError([str(exc)]) from None
    try:
        settings.check_exposure()
    except ValueError as exc:
        raise ConfigError([f"host: {exc}"]) from None
    return settings
