"""Settings of the ops flags (file defaults, Redis overrides), read once at start."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class FlagSettings(BaseSettings):
    """Where flags come from and how fast a change reaches this replica."""

    model_config = SettingsConfigDict(env_prefix="SPECGW_", extra="forbid")

    flags_dir: Path | None = Field(
        None,
        description="Directory holding the flagd-format `flags.json` (`SPECGW_FLAGS_DIR`); "
        "mount the ConfigMap as a whole directory, a subPath mount never updates.",
    )
    redis_url: str | None = Field(
        None, description="Redis for runtime overrides (`SPECGW_REDIS_URL`); unset = file only."
    )
    namespace: str = Field(
        "default",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Key namespace shared with the class store (`specgw:{namespace}:flags`).",
    )
    file_poll_interval_s: float = Field(
        0.5, gt=0, le=60, description="How often the flags file's resolved mtime is checked."
    )
    override_poll_interval_s: float = Field(
        1.0,
        gt=0,
        le=60,
        description="Fallback poll of the override version when a pub/sub message is lost; "
        "keeps every replica within 2 s of a change.",
    )
    op_timeout_s: float = Field(0.5, gt=0, le=30, description="Bound on one Redis round trip.")
    backoff_initial_s: float = Field(0.1, gt=0, le=60, description="First reconnect delay.")
    backoff_max_s: float = Field(2.0, gt=0, le=600, description="Cap of the reconnect delay.")
    audit_max_len: int = Field(
        10_000, ge=100, description="Approximate length cap of the audit stream (XADD MAXLEN ~)."
    )
    cache_max_entries: int = Field(
        4096,
        ge=16,
        description="Most (class, label) pairs kept resolved; beyond, the cache resets.",
    )

    def key_prefix(self) -> str:
        return f"specgw:{{{self.namespace}}}"
