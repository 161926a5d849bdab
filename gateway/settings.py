"""Typed gateway settings, read once at start (CLI flags > env `SPECGW_*` > YAML > defaults).

Each field's description is its `--help` text. Nothing here is read at import
time: `GatewaySettings()` is built by the CLI (through `gateway.config.resolve`, which
adds the engine and controller sections and the sources) or by a test, and passed down.
An unknown key is an error (`extra="forbid"`), at every level.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from engine.settings import EMBEDDED_SERVED_NAME
from gateway.flags.settings import FlagSettings
from gateway.state.settings import ClassStateSettings
from gateway.tenants.settings import TenantSettings

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class GatewaySettings(BaseSettings):
    """HTTP edge, admission, limits, auth and integrations of one gateway replica."""

    model_config = SettingsConfigDict(env_prefix="SPECGW_", extra="forbid")

    #: Section -> keys set once at the top level and copied into it: one Redis, one
    #: flags directory, one key namespace for flags, class state and rate limits.
    SHARED_KEYS: ClassVar[dict[str, tuple[str, ...]]] = {
        "flags": ("flags_dir", "redis_url", "namespace"),
        "state": ("redis_url", "namespace"),
    }
    #: Settings whose refused value is never echoed in an error: it may be a plaintext secret.
    UNECHOED: ClassVar[tuple[tuple[str, ...], ...]] = (
        ("api_keys",),
        ("admin_keys",),
        ("redis_password",),
        ("tenants", "keys"),
    )

    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind (0 = any free port).")
    served_model_name: str | None = Field(
        None,
        min_length=1,
        description="Model name clients send and /v1/models lists; null = the model id as "
        "`--model` gives it (as `vllm serve` does), `specgw-default` for the embedded model.",
    )
    served_model_aliases: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Further names clients may send for the model (comma-separated in env), "
        "e.g. a short name beside the Hugging Face id; answers report `served_model_name`.",
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="SHA-256 hex digests of user API keys (comma-separated in env). "
        "Empty = no auth, allowed only on a loopback address.",
    )
    admin_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="SHA-256 hex digests of admin keys (admin API, flags). Empty = admin API off.",
    )
    # Admission control and the nothing-lost contract.
    max_running: int = Field(
        32,
        ge=1,
        le=4096,
        description="Requests admitted to the engine; unset = the engine's `max_num_seqs` "
        "(32 with the embedded model on the CPU, 256 on a GPU by default).",
    )
    max_queued: int = Field(
        128, ge=0, le=100_000, description="Requests waiting for admission; beyond: 429."
    )
    queue_timeout_s: float = Field(
        30.0, gt=0, le=3600, description="Longest wait for admission before a 429 (seconds)."
    )
    stream_idle_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="A stream with no token for this long ends with an error."
    )
    request_timeout_s: float = Field(
        600.0, gt=0, le=86_400, description="Upper bound on one non-streaming request (seconds)."
    )
    drain_timeout_s: float = Field(
        30.0, ge=0, le=3600, description="On SIGTERM, time in-flight requests get to finish."
    )
    canary_interval_s: float = Field(
        2.0,
        ge=0,
        le=60,
        description="While the engine holds no work, send it a canary round trip this often "
        "(finds an idle engine core that stopped answering); 0 = off.",
    )
    canary_timeout_s: float = Field(
        5.0,
        gt=0,
        le=600,
        description="A canary unanswered for this long marks the engine hung: /ready 503, "
        "specgw_engine_ready 0.",
    )
    liveness_hung_s: float = Field(
        120.0,
        ge=0,
        le=86_400,
        description="An engine hung (a canary unanswered, or admitted work stalled) this "
        "long fails liveness: /health 503, so the orchestrator restarts the replica; "
        "0 = never (a hung engine is then only reported).",
    )
    # Connection bounds at the HTTP edge (gateway.connections): slow or hostile clients.
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="A request's line and headers must arrive within this time of the "
        "connection opening or the previous response ending; else 408 and close.",
    )
    body_timeout_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="A request body must arrive whole this soon after "
        "its headers; else 408 and close.",
    )
    keep_alive_timeout_s: int = Field(
        5, ge=1, le=3600, description="An idle kept-alive connection is closed after this long."
    )
    max_connections: int = Field(
        4096,
        ge=1,
        le=1_000_000,
        description="Open client connections per replica; one more gets 503 and is closed "
        "at once (keep it below the process's open-file limit).",
    )
    max_header_bytes: int = Field(
        16 * 1024,
        ge=1024,
        le=1024 * 1024,
        description="Largest request line plus headers (bytes); beyond: 431 and close.",
    )
    # Input limits (checked before any engine work).
    max_body_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="Largest request body accepted (bytes)."
    )
    max_messages: int = Field(256, ge=1, le=100_000, description="Most chat messages per request.")
    max_tools: int = Field(64, ge=0, le=1024, description="Most tools per request.")
    max_tool_schema_bytes: int = Field(
        64 * 1024, ge=256, description="Largest JSON size of all tool schemas together (bytes)."
    )
    max_schema_depth: int = Field(
        16, ge=1, le=256, description="Deepest nesting of a tool or response_format schema."
    )
    max_stop_sequences: int = Field(8, ge=0, le=64, description="Most stop strings per request.")
    max_stop_length: int = Field(64, ge=1, le=4096, description="Longest stop string (characters).")
    split_completion_control_tokens: bool = Field(
        False,
        description="Read control-token strings (<|im_start|>, ...) in /v1/completions prompts "
        "as text, as chat input always is; off = completion prompts are raw, as in vLLM.",
    )
    speculation_report: Literal["none", "summary", "detailed"] = Field(
        "summary",
        description="Each answer's speculation report: vLLM's `metrics.speculative_decoding` "
        "beside the gateway's `speculation` (class, k, reason). `summary` = vLLM's block "
        "without its per-step lists, `detailed` = with them, `none` = neither. A request "
        "may lower it with the body field `speculation_report`.",
    )
    # Integrations.
    redis_url: str | None = Field(
        None,
        description="Redis URL for cluster-wide class state, flag overrides and rate limits "
        "(rediss:// for TLS).",
    )
    redis_username: str | None = Field(
        None, description="Redis ACL user (AUTH username password); unset = the default user."
    )
    redis_password: SecretStr | None = Field(
        None,
        description="Redis password (requirepass or the ACL user's), e.g. from a Secret as "
        "SPECGW_REDIS_PASSWORD; a password in the URL wins over it.",
    )
    redis_password_file: Path | None = Field(
        None, description="File holding the Redis password (a mounted Secret), read at start."
    )
    redis_tls_ca_file: Path | None = Field(
        None, description="CA bundle that verifies the Redis server (rediss://); unset = system."
    )
    redis_tls_cert_file: Path | None = Field(
        None, description="Client certificate for Redis mutual TLS (tls-auth-clients yes)."
    )
    redis_tls_key_file: Path | None = Field(
        None, description="Private key of the Redis client certificate."
    )
    redis_tls_check_hostname: bool = Field(
        True, description="Check the Redis server certificate's name against the URL's host."
    )
    tenants: TenantSettings = Field(
        default_factory=TenantSettings,
        description="Per-key limits and fair-share weights: key labels (label -> digest), "
        "`default` and per-label `overrides` (requests_per_minute, tokens_per_minute, "
        "max_concurrent, weight), `replicas` (see gateway/tenants/README.md).",
    )
    namespace: str = Field(
        "default",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Za-z0-9_.-]+$",
        description="Redis key namespace of this deployment (`specgw:{namespace}:...`), "
        "shared by flag overrides, class state and rate limits.",
    )
    flags_dir: Path | None = Field(
        None, description="Directory holding the flagd-format flags.json (ConfigMap mount)."
    )
    flags: FlagSettings = Field(
        default_factory=FlagSettings,
        description="Ops flags: file and override polling, Redis timeouts, the audit stream.",
    )
    state: ClassStateSettings = Field(
        default_factory=ClassStateSettings,
        description="Cluster-wide class state in Redis: flush and pull intervals, key expiry, "
        "timeouts.",
    )
    otel_endpoint: str | None = Field(
        None,
        description="OTLP traces endpoint (full URL) used when OTEL_EXPORTER_OTLP_ENDPOINT and "
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT are unset; none of them = tracing off.",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Origins allowed by CORS; empty = CORS off."
    )
    log_level: str = Field("info", description="Log level of the gateway's loggers.")

    @field_validator(
        "api_keys", "admin_keys", "cors_origins", "served_model_aliases", mode="before"
    )
    @classmethod
    def _split_csv(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("api_keys", "admin_keys")
    @classmethod
    def _digests_only(cls, values: list[str]) -> list[str]:
        """A plaintext key would be hashed again at every request and never match: each
        request would get 401. Refused here, by position only, so the key is never shown."""
        clean = [value.strip().lower() for value in values]
        for position, value in enumerate(clean, start=1):
            if not _DIGEST.match(value):
                raise ValueError(
                    f"entry {position} of {len(clean)} is not a SHA-256 hex digest (64 hex "
                    "characters): give `spec-gateway keys hash KEY`'s output, never the key"
                )
        return clean

    @model_validator(mode="before")
    @classmethod
    def _shared_keys_at_the_top(cls, data: Any) -> Any:
        """A shared key set inside a section would be silently overwritten: refuse it."""
        if isinstance(data, dict):
            for section, keys in cls.SHARED_KEYS.items():
                given = data.get(section)
                for key in keys:
                    if isinstance(given, dict) and key in given:
                        raise ValueError(f"{section}.{key}: set it once, at the top level")
        return data

    @model_validator(mode="after")
    def _copy_shared_keys(self) -> GatewaySettings:
        self.flags = self.flags.model_copy(
            update={
                "flags_dir": self.flags_dir,
                "redis_url": self.redis_url,
                "namespace": self.namespace,
            }
        )
        shared: dict[str, Any] = {"namespace": self.namespace}
        if self.redis_url is not None:  # the state section needs a URL; unused without one
            shared["redis_url"] = self.redis_url
        self.state = self.state.model_copy(update=shared)
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
        return (init_settings, env_settings, file_secret_settings)

    @property
    def served_names(self) -> list[str]:
        """Every name the model answers to: the reported one first, then the aliases."""
        return [self.served_model_name or EMBEDDED_SERVED_NAME, *self.served_model_aliases]

    def check_exposure(self) -> None:
        """Refuse to serve without keys anywhere but loopback: no open gateway by mistake."""
        if not self.api_keys and self.host not in LOOPBACK_HOSTS:
            raise ValueError(
                f"refusing to bind {self.host!r} without API keys: set SPECGW_API_KEYS "
                "(SHA-256 digests; `spec-gateway keys hash KEY` prints one) or bind 127.0.0.1"
            )
