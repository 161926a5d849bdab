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

from pydantic import Field, PrivateAttr, model_validator
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

    #: Whether `max_running` was left to follow the engine's `max_num_seqs`.
    _max_running_follows: bool = PrivateAttr(default=False)

    @property
    def max_running_follows_engine(self) -> bool:
        """Whether `max_running` was left unset, so that it follows `max_num_seqs`."""
        return self._max_running_follows

    @model_validator(mode="after")
    def _engine_derived(self) -> ServeSettings:
        """The served name defaults to the model id, and the engine serves the same names
        (vLLM's `model_name` metric label, its serving layer's model list); admission
        follows the engine's batch unless set."""
        if self.served_model_name is None:
            self.served_model_name = self.engine.default_served_name()
        self._max_running_follows = "max_running" not in self.model_fields_set
        if self._max_running_follows:
            # Admitting more than one engine step holds only queues inside the engine,
            # where the gateway's admission and fair share cannot see the wait.
            self.max_running = self.engine.resolved_max_num_seqs()
        self.engine = self.engine.with_served_names(self.served_names)
        return self

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
