"""API-key checks with user and admin scopes.

Keys are configured as SHA-256 hex digests, so the plaintext never sits in a
ConfigMap or an environment dump; each presented key is hashed once and
compared with `hmac.compare_digest` against every configured digest (constant
time per comparison, and no early exit that would leak which key matched).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable

from gateway.errors import ErrorKind, GatewayError


class Scope(enum.Enum):
    USER = "user"
    ADMIN = "admin"


def digest(key: str) -> str:
    """SHA-256 hex digest of a key: what `SPECGW_API_KEYS` / `SPECGW_ADMIN_KEYS` hold."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class KeyRing:
    """Configured key digests per scope; empty user digests mean open access."""

    def __init__(self, user_digests: Iterable[str], admin_digests: Iterable[str]) -> None:
        self._user = tuple(d.strip().lower() for d in user_digests if d.strip())
        self._admin = tuple(d.strip().lower() for d in admin_digests if d.strip())

    @property
    def open_access(self) -> bool:
        """No user keys: every /v1 request is allowed (only safe on loopback)."""
        return not self._user

    @staticmethod
    def _matches(presented: str, digests: tuple[str, ...]) -> bool:
        found = False
        for candidate in digests:
            found |= hmac.compare_digest(presented, candidate)
        return found

    def allows(self, authorization: str | None, scope: Scope) -> bool:
        """`check` as a yes/no, for callers that leave the refusal to the route."""
        try:
            self.check(authorization, scope)
        except GatewayError:
            return False
        return True

    def check(self, authorization: str | None, scope: Scope) -> str | None:
        """Raise 401 for a missing/unknown key, 403 for a key of the wrong scope.

        Returns the presented key's digest, so a caller that also needs it (the tenant's
        identity) does not hash the key again; None under open access, where a user
        request's key is not looked at.
        """
        if scope is Scope.USER and self.open_access:
            return None
        token = bearer_token(authorization)
        if token is None:
            raise GatewayError(
                ErrorKind.UNAUTHORIZED,
                "Missing API key: send 'Authorization: Bearer <key>'.",
                headers={"www-authenticate": "Bearer"},
            )
        presented = digest(token)
        is_admin = self._matches(presented, self._admin)
        is_user = self._matches(presented, self._user)
        if scope is Scope.ADMIN:
            if is_admin:
                return presented
            if is_user:
                raise GatewayError(ErrorKind.FORBIDDEN, "This key has no admin scope.")
        elif is_user:
            return presented
        elif is_admin:
            raise GatewayError(ErrorKind.FORBIDDEN, "Admin keys cannot call the inference API.")
        raise GatewayError(
            ErrorKind.UNAUTHORIZED, "Invalid API key.", headers={"www-authenticate": "Bearer"}
        )


def bearer_token(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header, or None."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()
