"""Real gateway processes with per-key limits: their environment, and one chat request
through the official `openai` client that returns the raw response (its headers)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import openai

from gateway.auth import digest
from tests.gateway.conftest import ADMIN_KEY, NO_CALIBRATION, GatewayProcess

MODEL = "specgw-default"
PROMPT = "Say hi."


def limits_env(
    keys: Mapping[str, str], tenants: Mapping[str, Any], redis_url: str | None = None
) -> dict[str, str]:
    """`spec-gateway serve`'s environment: `keys` (label -> the key itself) are the only
    user keys, `tenants` the rest of the `tenants:` block, on `redis_url` if given."""
    digests = {label: digest(key) for label, key in keys.items()}
    env = {
        "SPECGW_API_KEYS": ",".join(digests.values()),
        "SPECGW_ADMIN_KEYS": digest(ADMIN_KEY),
        "SPECGW_TENANTS": json.dumps({"keys": digests, **tenants}),
        # No start-up calibration: these tests count requests, not the policy's speed.
        **NO_CALIBRATION,
    }
    if redis_url is not None:
        env["SPECGW_REDIS_URL"] = redis_url
    return env


def ask(gw: GatewayProcess, key: str, max_tokens: int = 2, **extra: Any) -> openai.APIResponse[Any]:
    """One greedy chat request of `PROMPT`; raises the SDK's error (429: RateLimitError)."""
    client = gw.client(key, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=max_tokens,
        temperature=0,
        extra_body=extra or None,
    )
    return raw  # type: ignore[return-value]
