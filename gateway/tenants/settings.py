"""Per-key limits and fair-share weights, from the gateway config's `tenants:` block.

Keys are named by a label the operator chooses, mapped to the key's SHA-256
digest (the form `api_keys` already takes), so neither the config nor a metric
label ever holds a secret::

    tenants:
      keys: {team-a: 3b5d..., team-b: 9f86...}     # label -> SHA-256 hex digest
      default: {requests_per_minute: 600, tokens_per_minute: 200000, max_concurrent: 16}
      overrides:
        team-a: {tokens_per_minute: 1000000, weight: 4}   # unset fields: the default's
      replicas: 3

A limit of 0 means no limit. A key in `api_keys` without a label gets the
default policy and counts as `other` in metrics (its limits and its fair share
are still its own: they count by digest).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Metric label of a valid key that has no label in `tenants.keys`.
OTHER = "other"
#: Label (and key) of every request when the gateway runs without API keys.
ANONYMOUS = "anonymous"
_LABEL = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


class KeyPolicy(BaseModel):
    """One key's limits (0 = none) and its weight in admission's fair share."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    requests_per_minute: int = Field(0, ge=0, description="Requests per minute; 0 = no limit.")
    tokens_per_minute: int = Field(
        0,
        ge=0,
        description="Prompt + completion tokens per minute, reserved at admission from "
        "max_tokens and settled from usage; 0 = no limit.",
    )
    max_concurrent: int = Field(0, ge=0, description="Requests in flight at once; 0 = no limit.")
    weight: float = Field(
        1.0, gt=0, le=1000, description="Share of running slots relative to other waiting keys."
    )

    @property
    def limited(self) -> bool:
        return bool(self.requests_per_minute or self.tokens_per_minute or self.max_concurrent)


class TenantSettings(BaseModel):
    """Key labels, the default policy, per-label overrides, and how limits go cluster-wide."""

    model_config = ConfigDict(extra="forbid")

    keys: dict[str, str] = Field(
        default_factory=dict, description="Label -> SHA-256 hex digest of a user key."
    )
    default: KeyPolicy = Field(default_factory=KeyPolicy, description="Policy of every key.")
    overrides: dict[str, KeyPolicy] = Field(
        default_factory=dict, description="Label -> the fields that differ from `default`."
    )
    replicas: int = Field(
        1,
        ge=1,
        le=10_000,
        description="Gateway replicas: while Redis is unreachable each enforces limit / replicas.",
    )
    default_max_tokens: int = Field(
        1024,
        ge=1,
        description="Completion tokens reserved for a request that sets no max_tokens.",
    )
    redis_timeout_s: float = Field(
        0.05,
        gt=0,
        le=5,
        description="Bound on the one Redis call per request; slower = this replica's local share.",
    )
    redis_connect_timeout_s: float = Field(
        0.5,
        gt=0,
        le=30,
        description="Bound on opening a Redis connection (TLS and AUTH included): rare, as "
        "connections are pooled, but slower than a call.",
    )
    concurrency_lease_s: float = Field(
        900.0,
        ge=10,
        le=86_400,
        description="How long an in-flight slot counts in Redis if its replica dies holding it.",
    )

    @field_validator("keys")
    @classmethod
    def _check_keys(cls, keys: dict[str, str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for label, digest in keys.items():
            if not _LABEL.match(label) or label in (OTHER, ANONYMOUS):
                raise ValueError(
                    f"key label {label!r}: 1-64 of [A-Za-z0-9_.-], not {OTHER!r}/{ANONYMOUS!r}"
                )
            clean = digest.strip().lower()
            if not _DIGEST.match(clean):
                raise ValueError(
                    f"key {label!r}: expected a SHA-256 hex digest (`spec-gateway keys hash`), "
                    "never the key itself"
                )
            out[label] = clean
        if len(set(out.values())) != len(out):
            raise ValueError("two key labels name the same digest")
        return out

    @model_validator(mode="after")
    def _check_overrides(self) -> TenantSettings:
        unknown = sorted(set(self.overrides) - set(self.keys))
        if unknown:
            raise ValueError(f"overrides for labels not in tenants.keys: {', '.join(unknown)}")
        return self

    def policy_of(self, label: str) -> KeyPolicy:
        """`default` with the fields the label's override sets."""
        override = self.overrides.get(label)
        if override is None:
            return self.default
        return self.default.model_copy(update=override.model_dump(exclude_unset=True))
