"""A request's way in: its key's limits first, then a running slot shared fairly between keys."""

from __future__ import annotations

from collections.abc import Callable

from gateway.admission import Admission
from gateway.errors import GatewayError
from gateway.tenants.directory import Tenant
from gateway.tenants.limiter import Grant, KeyLimiter


async def admit(
    limiter: KeyLimiter | None,
    admission: Admission,
    tenant: Tenant,
    reserve: int,
    class_id: str,
    on_shed: Callable[[GatewayError], None] | None = None,
) -> Grant:
    """The key's limits (one Redis call at most; 429 with OpenAI's headers, `on_shed`
    told), then a running slot (`Admission`). A request refused a slot used nothing of
    its key's reservation, so it is settled at 0 tokens."""
    grant = Grant(tenant, reserve)
    if limiter is not None:
        try:
            grant = await limiter.admit(tenant, reserve)
        except GatewayError as exc:
            if on_shed is not None:
                on_shed(exc)
            raise
    try:
        await admission.acquire(class_id, tenant.key)
    except BaseException:
        if limiter is not None:
            limiter.settle(grant, 0)
        raise
    return grant
