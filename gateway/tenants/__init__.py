"""Tenants: per-key limits (requests, tokens, concurrency) cluster-wide, and who a key is."""

from gateway.tenants.decision import Decision
from gateway.tenants.directory import Tenant, TenantDirectory
from gateway.tenants.limiter import MODES, Grant, KeyLimiter, LimitEvents, Mode
from gateway.tenants.settings import ANONYMOUS, OTHER, KeyPolicy, TenantSettings

__all__ = [
    "ANONYMOUS",
    "MODES",
    "OTHER",
    "Decision",
    "Grant",
    "KeyLimiter",
    "KeyPolicy",
    "LimitEvents",
    "Mode",
    "Tenant",
    "TenantDirectory",
    "TenantSettings",
]
