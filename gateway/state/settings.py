"""Settings of the Redis-backed cluster-wide class state, read once at start.

Every field has a default and bounds; descriptions double as `--help` text.
Nothing here reads the environment at import: `ClassStateSettings()` is built
by the composition root (or a test) and passed down.
"""

from __future__ import annotations

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class ClassStateSettings(BaseSettings):
    """Where and how often a replica syncs its per-class statistics with Redis."""

    model_config = SettingsConfigDict(env_prefix="SPECGW_", extra="forbid")

    redis_url: str = Field(
        "redis://127.0.0.1:6379/0",
        description="Redis URL (`SPECGW_REDIS_URL`); the same server holds flag overrides.",
    )
    namespace: str = Field(
        "default",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Key namespace: keys are `specgw:{namespace}:...`; the braces are a Redis "
        "Cluster hash tag, so all of one deployment's keys share a slot and the flush "
        "script stays atomic there too.",
    )
    flush_interval_s: float = Field(
        0.5, gt=0, le=60, description="Longest time a local delta waits before it is pushed."
    )
    flush_max_outcomes: int = Field(
        256, ge=1, le=1_000_000, description="Push early once this many outcomes are pending."
    )
    pull_interval_s: float = Field(
        1.0, gt=0, le=300, description="How often merged cluster totals of live classes are read."
    )
    live_window_s: float = Field(
        600.0, gt=0, description="A class updated by any replica within this window is live."
    )
    key_ttl_s: int = Field(
        7 * 86_400,
        ge=60,
        description="Expiry of class keys, refreshed on each write: unused classes age out, "
        "learned state of used ones survives restarts.",
    )
    op_timeout_s: float = Field(
        0.5, gt=0, le=30, description="Bound on one Redis round trip (socket timeout)."
    )
    connect_timeout_s: float = Field(
        0.5, gt=0, le=30, description="Bound on opening a Redis connection."
    )
    startup_timeout_s: float = Field(
        2.0, ge=0, le=60, description="Longest wait for the warm-up read at start; then go on."
    )
    backoff_initial_s: float = Field(
        0.1, gt=0, le=60, description="First reconnect delay after a failed round trip."
    )
    backoff_max_s: float = Field(
        5.0, gt=0, le=600, description="Cap of the exponential reconnect delay."
    )
    max_classes: int = Field(
        1024,
        ge=1,
        le=100_000,
        description="Most classes read or retained; deltas of further classes are dropped "
        "(counted) while Redis is away.",
    )

    @model_validator(mode="after")
    def _check_backoff(self) -> ClassStateSettings:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError("backoff_max_s must be >= backoff_initial_s")
        return self

    def key_prefix(self) -> str:
        return f"specgw:{{{self.namespace}}}"
