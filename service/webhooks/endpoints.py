"""A tenant's webhook endpoints and signing secret, and a job's deliveries, as `/webhooks` and
`GET /jobs/{id}/webhooks` ask for them (what is sent, when and how: `rules.py`)."""

from __future__ import annotations

from eft.service.errors import Problem, RequestInvalid, ServiceError
from eft.service.settings import Settings
from eft.service.store.store import Store
from eft.service.webhooks import rules
from eft.types.webhooks import WebhookDelivery, WebhookDeliveryList, WebhookEndpoint, WebhookEndpointList


class TooManyEndpoints(ServiceError):
    status_code = 409
    code = "webhook_endpoints_limit"


class EndpointNotFound(ServiceError):
    status_code = 404
    code = "webhook_endpoint_not_found"


class WebhookEndpoints:
    """The webhook endpoints of one service's tenants."""

    def __init__(self, store: Store, settings: Settings):
        self.store, self.settings = store, settings

    def create(self, tenant: str, url: str, events: list[str]) -> WebhookEndpoint:
        """Send `events` of `tenant`'s jobs to `url`. The tenant's first endpoint makes its
        signing secret, shown in the answer once. Raises RequestInvalid for a URL this server
        does not send to, TooManyEndpoints over the tenant's limit."""
        settings = self.settings
        self._refuse_unsendable(url, "url")
        try:
            row = rules.create_endpoint(self.store.engine, tenant, url, events, settings.webhook_endpoints_per_tenant)
        except rules.TooManyEndpoints:
            raise TooManyEndpoints(
                f"this tenant has {settings.webhook_endpoints_per_tenant} webhook endpoints, as many as this server "
                "allows (EFT_WEBHOOK_ENDPOINTS_PER_TENANT): delete one (DELETE /webhooks/{id}), or send several "
                "event types to one endpoint", param="url") from None
        secret = rules.ensure_secret(self.store.engine, tenant)
        return WebhookEndpoint(**{k: v for k, v in row.items() if k != "tenant"}, secret=secret)

    def list(self, tenant: str) -> WebhookEndpointList:
        return WebhookEndpointList(data=[WebhookEndpoint(**{k: v for k, v in row.items() if k != "tenant"})
                                         for row in rules.list_endpoints(self.store.engine, tenant)])

    def delete(self, tenant: str, endpoint_id: str) -> None:
        """Delete the endpoint; what was still owed to it is cancelled. Raises EndpointNotFound."""
        if not rules.delete_endpoint(self.store.engine, tenant, endpoint_id):
            raise EndpointNotFound(f"no webhook endpoint {endpoint_id!r}: list them with GET /webhooks",
                                   param="endpoint_id")

    def rotate_secret(self, tenant: str) -> str:
        """A new signing secret for `tenant`'s webhooks; the old one stops signing."""
        return rules.rotate_secret(self.store.engine, tenant)

    def deliveries(self, job_id: str, tenant: str | None) -> WebhookDeliveryList:
        """The job's deliveries, oldest first, each with every attempt. Raises JobNotFound."""
        self.store.get_job(job_id, tenant)
        return WebhookDeliveryList(data=[WebhookDelivery(**d) for d in rules.deliveries_of(self.store.engine, job_id)])

    def check_job_url(self, url: str, tenant: str) -> None:
        """A job's `webhook_url`: one this server sends to, for a tenant with a signing secret
        (made by POST /webhooks/secret or its first endpoint). Raises RequestInvalid."""
        self._refuse_unsendable(url, "webhook_url")
        if not rules.has_secret(self.store.engine, tenant):
            raise RequestInvalid(problems=[Problem(
                "webhook_url", "webhook_secret_missing", "webhooks are signed with your tenant's secret, which it "
                "has not made yet: POST /webhooks/secret (shown once), then create the job again")])

    def _refuse_unsendable(self, url: str, param: str) -> None:
        settings = self.settings
        problem = rules.url_problem(url, settings.webhook_allow_loopback, settings.webhook_allow_private,
                                    settings.webhook_dns_timeout_s)
        if problem:
            raise RequestInvalid(problems=[Problem(param, "webhook_url_refused", f"the webhook URL {problem}")])
