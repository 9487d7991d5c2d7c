"""`/webhooks`: a tenant's webhook endpoints and signing secret; `GET /jobs/{id}/webhooks`: the
deliveries of a job's events with every attempt. See service/webhooks.py."""

from __future__ import annotations

from fastapi import APIRouter

from eft.api.deps import CurrentPrincipal, CurrentTenant, JobServiceDep
from eft.service import webhooks
from eft.service.errors import Problem, RequestInvalid, ServiceError
from eft.types.webhooks import (
    WebhookDelivery,
    WebhookDeliveryList,
    WebhookEndpoint,
    WebhookEndpointCreate,
    WebhookEndpointList,
    WebhookSecret,
)

router = APIRouter(tags=["webhooks"])


class TooManyEndpoints(ServiceError):
    status_code = 409
    code = "webhook_endpoints_limit"


class EndpointNotFound(ServiceError):
    status_code = 404
    code = "webhook_endpoint_not_found"


@router.post("/webhooks", status_code=201, response_model=WebhookEndpoint)
def create_endpoint(body: WebhookEndpointCreate, service: JobServiceDep, principal: CurrentPrincipal) -> WebhookEndpoint:
    """Send the chosen job events to `url`. The first endpoint of a tenant makes its signing
    secret and shows it in this response, once. (An admin key's are its own tenant's.)"""
    settings, tenant = service.settings, principal.tenant
    problem = webhooks.url_problem(body.url, settings.webhook_allow_loopback, settings.webhook_allow_private,
                                   settings.webhook_dns_timeout_s)
    if problem:
        raise RequestInvalid(problems=[Problem("url", "webhook_url_refused", f"the webhook URL {problem}")])
    try:
        row = webhooks.create_endpoint(service.store.engine, tenant, body.url, list(body.events),
                                       settings.webhook_endpoints_per_tenant)
    except webhooks.TooManyEndpoints:
        raise TooManyEndpoints(
            f"this tenant has {settings.webhook_endpoints_per_tenant} webhook endpoints, as many as this server "
            "allows (EFT_WEBHOOK_ENDPOINTS_PER_TENANT): delete one (DELETE /webhooks/{id}), or send several "
            "event types to one endpoint", param="url") from None
    secret = webhooks.ensure_secret(service.store.engine, tenant)
    return WebhookEndpoint(**{k: v for k, v in row.items() if k != "tenant"}, secret=secret)


@router.get("/webhooks", response_model=WebhookEndpointList)
def list_endpoints(service: JobServiceDep, principal: CurrentPrincipal) -> WebhookEndpointList:
    tenant = principal.tenant
    return WebhookEndpointList(data=[WebhookEndpoint(**{k: v for k, v in row.items() if k != "tenant"})
                                     for row in webhooks.list_endpoints(service.store.engine, tenant)])


@router.delete("/webhooks/{endpoint_id}", status_code=204)
def delete_endpoint(endpoint_id: str, service: JobServiceDep, principal: CurrentPrincipal) -> None:
    """Delete the endpoint; what was still owed to it is cancelled (status `cancelled`)."""
    if not webhooks.delete_endpoint(service.store.engine, principal.tenant, endpoint_id):
        raise EndpointNotFound(f"no webhook endpoint {endpoint_id!r}: list them with GET /webhooks",
                               param="endpoint_id")


@router.post("/webhooks/secret", response_model=WebhookSecret)
def rotate_secret(service: JobServiceDep, principal: CurrentPrincipal) -> WebhookSecret:
    """A new signing secret for this tenant's webhooks, shown once; the old one stops signing."""
    return WebhookSecret(secret=webhooks.rotate_secret(service.store.engine, principal.tenant))


@router.get("/jobs/{job_id}/webhooks", response_model=WebhookDeliveryList)
def job_deliveries(job_id: str, service: JobServiceDep, tenant: CurrentTenant) -> WebhookDeliveryList:
    """The job's webhook deliveries, oldest first, each with every attempt to deliver it."""
    service.store.get_job(job_id, tenant)
    return WebhookDeliveryList(data=[WebhookDelivery(**d) for d in webhooks.deliveries_of(service.store.engine, job_id)])
