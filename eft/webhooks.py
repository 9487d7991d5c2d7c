"""`client.webhooks`: where your jobs' events go, and the secret that signs them
(`POST /webhooks`, `GET /webhooks`, `DELETE /webhooks/{id}`, `POST /webhooks/secret`)."""

from __future__ import annotations

from typing import Sequence

from eft._resource import SyncAPIResource
from eft.types.webhooks import WebhookEndpoint, WebhookEndpointList, WebhookSecret


class Webhooks(SyncAPIResource):

    def create(self, url: str, events: Sequence[str] | None = None) -> WebhookEndpoint:
        """Send your jobs' events (all four unless `events` names some) to `url`; the first
        endpoint's response carries your signing secret, once."""
        body = {"url": url, **({"events": list(events)} if events is not None else {})}
        return self._request("POST", "/webhooks", cast=WebhookEndpoint, json=body)

    def list(self) -> WebhookEndpointList:
        return self._request("GET", "/webhooks", cast=WebhookEndpointList)

    def delete(self, endpoint_id: str) -> None:
        self._send("DELETE", f"/webhooks/{endpoint_id}")

    def rotate_secret(self) -> WebhookSecret:
        """A new signing secret (shown once); the old one stops signing at once."""
        return self._request("POST", "/webhooks/secret", cast=WebhookSecret)
