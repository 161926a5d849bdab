"""A limiter's answer, and how it reads on the wire: OpenAI's headers and 429 error.

Headers (OpenAI API reference, "Rate limits"): `x-ratelimit-limit-requests`,
`x-ratelimit-remaining-requests`, `x-ratelimit-reset-requests` and the same
three for `-tokens`; a reset is a Go duration string ("1s", "6m0s", "20ms").
A refusal is HTTP 429 with `retry-after` (whole seconds) and `retry-after-ms`
(the openai-python and openai-node clients prefer the latter), and OpenAI's
error object: `type` "requests" or "tokens", `code` "rate_limit_exceeded".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from gateway.errors import ErrorKind, GatewayError
from gateway.tenants.gcra import Verdict

#: Every header a browser client may need to read back (CORS `expose_headers`).
RATELIMIT_HEADERS = (
    "x-ratelimit-limit-requests",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-reset-requests",
    "x-ratelimit-limit-tokens",
    "x-ratelimit-remaining-tokens",
    "x-ratelimit-reset-tokens",
    "retry-after",
    "retry-after-ms",
)

Status = Literal["allowed", "requests", "tokens", "concurrency"]


@dataclass(frozen=True, slots=True)
class Decision:
    """One check of one key: which limit refused it (if any) and every bucket's state.

    `requests` / `tokens` are None for a dimension the key has no limit on.
    """

    status: Status
    requests: Verdict | None
    tokens: Verdict | None
    max_concurrent: int = 0
    retry_ms: float = 0.0

    @property
    def allowed(self) -> bool:
        return self.status == "allowed"

    def headers(self) -> dict[str, str]:
        return ratelimit_headers(self.requests, self.tokens)

    def refusal(self, requested_tokens: int) -> GatewayError:
        """The 429 of a refused check (with the headers)."""
        headers = self.headers()
        if self.status == "requests" and self.requests is not None:
            return rate_limited("requests", self.requests, 1, headers)
        if self.status == "tokens" and self.tokens is not None:
            return rate_limited("tokens", self.tokens, requested_tokens, headers)
        return concurrency_limited(self.max_concurrent, self.retry_ms, headers)


def go_duration(ms: float) -> str:
    """Milliseconds as Go's `time.Duration.String()` writes them, to the millisecond."""
    total = max(0, math.ceil(ms - 1e-6))
    if total == 0:
        return "0s"
    if total < 1000:
        return f"{total}ms"
    hours, rest = divmod(total, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    seconds = f"{rest // 1000}" if rest % 1000 == 0 else f"{rest / 1000:.3f}".rstrip("0")
    text = f"{hours}h" if hours else ""
    if hours or minutes:
        text += f"{minutes}m"
    return f"{text}{seconds}s"


def ratelimit_headers(requests: Verdict | None, tokens: Verdict | None) -> dict[str, str]:
    """The `x-ratelimit-*` headers of the limits that apply (None = no such limit)."""
    out: dict[str, str] = {}
    for name, verdict in (("requests", requests), ("tokens", tokens)):
        if verdict is not None:
            out[f"x-ratelimit-limit-{name}"] = str(verdict.limit)
            out[f"x-ratelimit-remaining-{name}"] = str(verdict.remaining)
            out[f"x-ratelimit-reset-{name}"] = go_duration(verdict.reset_ms)
    return out


def _retry_headers(retry_ms: float) -> dict[str, str]:
    if math.isinf(retry_ms):
        return {}
    return {
        "retry-after": str(max(1, math.ceil(retry_ms / 1000))),
        "retry-after-ms": str(max(1, math.ceil(retry_ms))),
    }


def rate_limited(
    dimension: str, verdict: Verdict, requested: int, headers: dict[str, str]
) -> GatewayError:
    """429 for an exceeded per-minute limit, `dimension` "requests" or "tokens"."""
    tokens = dimension == "tokens"
    kind = ErrorKind.RATE_LIMITED_TOKENS if tokens else ErrorKind.RATE_LIMITED_REQUESTS
    unit = "TPM" if tokens else "RPM"
    if math.isinf(verdict.retry_ms):
        message = (
            f"Request too large for {dimension} per min ({unit}): Limit {verdict.limit}, "
            f"Requested {requested}. Reduce the prompt or max_tokens."
        )
    else:
        message = (
            f"Rate limit reached for {dimension} per min ({unit}): Limit {verdict.limit}, "
            f"Used {verdict.used}, Requested {requested}. "
            f"Please try again in {go_duration(verdict.retry_ms)}."
        )
    return GatewayError(kind, message, headers={**headers, **_retry_headers(verdict.retry_ms)})


def concurrency_limited(limit: int, retry_ms: float, headers: dict[str, str]) -> GatewayError:
    """429 for a key with `limit` requests already in flight."""
    return GatewayError(
        ErrorKind.RATE_LIMITED_REQUESTS,
        f"Rate limit reached for concurrent requests: Limit {limit}, In flight {limit}. "
        "Please retry when one of them has finished.",
        headers={**headers, **_retry_headers(retry_ms)},
    )
