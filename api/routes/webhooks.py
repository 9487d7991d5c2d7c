"""`/webhooks`: a tenant's webhook endpoints and signing secret; `GET /jobs/{id}/webhooks`: the
deliveries of a job's events with every attempt (service/webhooks/endpoints.py)."""

from __future__ import annotations

from fastapi import APIRouter

from eft.api.deps import CurrentPrincipal, CurrentTenant, JobServiceDep
from eft.types.webhooks import (
    WebhookDeliveryList,
    WebhookEndpoint,
    WebhookEndpointCreate,
    WebhookEndpointList,
    WebhookSecret,
)

router = APIRouter(tags=["webhooks"])


@router.post("/webhooks", status_code=201, response_model=WebhookEndpoint)
def create_endpoint(body: WebhookEndpointCreate, service: JobServiceDep, principal: CurrentPrincipal) -> WebhookEndpoint:
    """Send the chosen job events to `url`. The first endpoint of a tenant makes its signing
    secret and shows it in this response, once. (An admin key's are its own tenant's.)"""
    return service.webhooks.create(principal.tenant, body.url, list(body.events))


@router.get("/webhooks", response_model=WebhookEndpointList)
def list_endpoints(service: JobServiceDep, principal: CurrentPrincipal) -> WebhookEndpointList:
    return service.webhooks.list(principal.tenant)


@router.delete("/webhooks/{endpoint_id}", status_code=204)
def delete_endpoint(endpoint_id: str, service: JobServiceDep, principal: CurrentPrincipal) -> None:
    """Delete the endpoint; what was still owed to it is cancelled (status `cancelled`)."""
    service.webhooks.delete(principal.tenant, endpoint_id)


@router.post("/webhooks/secret", response_model=WebhookSecret)
def rotate_secret(service: JobServiceDep, principal: CurrentPrincipal) -> WebhookSecret:
    """A new signing secret for this tenant's webhooks, shown once; the old one stops signing."""
    return WebhookSecret(secret=service.webhooks.rotate_secret(principal.tenant))


@router.get("/jobs/{job_id}/webhooks", response_model=WebhookDeliveryList)
def job_deliveries(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> WebhookDeliveryList:
    """The job's webhook deliveries, oldest first, each with every attempt to deliver it."""
    return service.webhooks.deliveries(job_id, tenant)
