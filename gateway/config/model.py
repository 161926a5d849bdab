"""`ServeSettings`: everything `spec-gateway serve` reads, as one validated tree.

The gateway's own keys stay at the top level (the YAML layout and `SPECGW_*` names the
gateway always had); each component has its section: `engine` (`EngineSettings`),
`control` (`ControllerSettings`), `flags` (`FlagSettings`), `state`
(`ClassStateSettings`) and `tenants` (`TenantSettings`). Every level forbids unknown keys.

Precedence, one for every key: flags > environment > YAML file > defaults
(`gateway.config.sources`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from engine.settings import EngineSettings
from gateway.config.sources import ConfigFileSource, SectionedEnvSource
from gateway.control.settings import ControllerSettings
from gateway.settings import GatewaySettings


class ServeSettings(GatewaySettings):
    """The gateway's settings with the engine and controller sections and the file they
    were read from; `create_app` takes it as the gateway's settings."""

    model_config = SettingsConfigDict(env_prefix="SPECGW_", extra="forbid")

    config_file: Path | None = Field(
        None,
        description="YAML file of settings (`--config`): gateway keys at the top level, "
        "`engine:`, `control:`, `flags:`, `state:`, `tenants:` sections.",
    )
    engine: EngineSettings = Field(
        default_factory=EngineSettings,
        description="The embedded engine: target, drafter, K, vLLM knobs.",
    )
    control: ControllerSettings = Field(
        default_factory=ControllerSettings,
        description="The speculation controller: classes, policy, estimation, costs, drift.",
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The flags' source, when there is one, is put first by pydantic-settings itself.
        return (init_settings, SectionedEnvSource(settings_cls), ConfigFileSource(settings_cls))
