"""Who a request is: its key's digest (what limits and fair shares count by) and label.

The label comes only from the config (`tenants.keys`), so metric label sets stay
bounded: the configured labels, `other` (a valid key without a label) and
`anonymous` (no API keys configured at all).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gateway.auth import bearer_token, digest
from gateway.tenants.settings import ANONYMOUS, OTHER, KeyPolicy, TenantSettings


@dataclass(frozen=True, slots=True)
class Tenant:
    """One key as admission and the limiter see it."""

    #: The key's SHA-256 digest (or `anonymous`): the unit of limits and fair shares.
    key: str
    #: The config's label for the key, `other`, or `anonymous`: what metrics show.
    label: str
    policy: KeyPolicy

    @property
    def weight(self) -> float:
        return self.policy.weight


#: Who a request is when nobody says (a service called without a tenant): no limits.
UNLIMITED_ANONYMOUS = Tenant(ANONYMOUS, ANONYMOUS, KeyPolicy())


class TenantDirectory:
    """Digest -> label -> policy, resolved once per request from its Authorization header."""

    def __init__(self, settings: TenantSettings, api_keys: Iterable[str] = ()) -> None:
        """`api_keys`: the user key digests; none = open access, every request anonymous
        (a presented key is then not even looked at: unbounded digests would mean
        unbounded limiter state)."""
        known = {d.strip().lower() for d in api_keys if d.strip()}
        stray = sorted(label for label, d in settings.keys.items() if d not in known)
        if stray:
            raise ValueError(f"tenants.keys labels a digest that is not in api_keys: {stray}")
        self.settings = settings
        self.open_access = not known
        self._labels = {d: label for label, d in settings.keys.items()}
        self._policies = {label: settings.policy_of(label) for label in settings.keys}
        self.anonymous = Tenant(ANONYMOUS, ANONYMOUS, settings.default)

    @property
    def labels(self) -> tuple[str, ...]:
        """Every label a metric can carry, configured ones first."""
        return (*self._labels.values(), OTHER, ANONYMOUS)

    def identify(self, authorization: str | None) -> Tenant:
        """The tenant of an already authorized request (`KeyRing.check` passed)."""
        token = bearer_token(authorization)
        if token is None or self.open_access:
            return self.anonymous
        return self.by_digest(digest(token))

    def by_digest(self, key_digest: str) -> Tenant:
        label = self._labels.get(key_digest)
        if label is None:
            return Tenant(key_digest, OTHER, self.settings.default)
        return Tenant(key_digest, label, self._policies[label])

    def weight_of(self, key: str) -> float:
        """Admission's weight of a tenant key (a digest or `anonymous`)."""
        label = self._labels.get(key)
        return self._policies[label].weight if label is not None else self.settings.default.weight

    def label_of(self, key: str) -> str:
        if key == ANONYMOUS:
            return ANONYMOUS
        return self._labels.get(key, OTHER)
