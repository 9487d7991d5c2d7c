"""FastAPI dependencies as `Annotated` aliases: the job service and the caller.

`CurrentPrincipal` is the authenticated caller (tenant and role, from `Authorization: Bearer`);
`CurrentTenant` is the tenant whose objects the caller may see, None for an admin (every tenant).
Create with `principal.tenant`, read with `CurrentTenant`.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from eft.service.accounts.auth import KeyStore, Principal
from eft.service import isolation
from eft.service.accounts.idempotency import Idempotency
from eft.service.jobs.manager import JobService

# Documents the scheme in OpenAPI; the key itself is checked by KeyStore.authenticate.
bearer = HTTPBearer(auto_error=False, description="An API key: `eft keys create`, or the one `eft up` writes.")


# Dependencies that do no I/O are `async def`: FastAPI runs a plain `def` in its thread pool,
# a hop per dependency per request.
async def get_job_service(request: Request) -> JobService:
    return request.app.state.job_service


def get_principal(  # a database read: stays in the thread pool
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    keys: KeyStore = request.app.state.keys
    principal = keys.authenticate(request.headers.get("authorization"))
    request.app.state.rate_limiter.take(principal.tenant)
    request.state.tenant = principal.tenant
    request.state.scope = principal.scope  # what the error handlers may read on its behalf
    return principal


async def get_idempotency(request: Request) -> Idempotency:
    return request.app.state.job_service.idempotency


async def get_principal_in_context(principal: Annotated[Principal, Depends(get_principal)]) -> Principal:
    """The principal, also named as the tenant on whose behalf helper processes work (their
    shares per tenant, service/isolation.py): set here, in the request's own context, which the
    route's thread then copies."""
    isolation.tenant.set(principal.tenant)
    return principal


async def get_tenant(principal: Annotated[Principal, Depends(get_principal_in_context)]) -> str | None:
    return principal.scope


JobServiceDep = Annotated[JobService, Depends(get_job_service)]
CurrentPrincipal = Annotated[Principal, Depends(get_principal_in_context)]
CurrentTenant = Annotated[str | None, Depends(get_tenant)]
IdempotencyDep = Annotated[Idempotency, Depends(get_idempotency)]
IdempotencyKey = Annotated[str | None, Header(max_length=256, description=(
    "Repeat a create safely: the same key and body return the first result, the same key with "
    "another body is a 409."))]
