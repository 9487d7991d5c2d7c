"""Wire models of webhooks (`/webhooks`, `GET /jobs/{id}/webhooks`); see service/webhooks/rules.py."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from eft.types._base import ListResponse, _Request, _Response

EventType = Literal["fine_tuning.job.succeeded", "fine_tuning.job.failed", "fine_tuning.job.cancelled",
                    "fine_tuning.job.paused"]
ALL_EVENTS: list[EventType] = ["fine_tuning.job.succeeded", "fine_tuning.job.failed", "fine_tuning.job.cancelled",
                               "fine_tuning.job.paused"]


class WebhookEndpointCreate(_Request):
    url: str = Field(..., min_length=8, max_length=2048, description="An https URL (plain-http loopback in local mode).")
    events: list[EventType] = Field(
        default_factory=lambda: list(ALL_EVENTS), min_length=1,
        description="The event types sent to this URL (default: all).")


class WebhookEndpoint(_Response):
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    id: str
    url: str
    events: list[str]
    created_at: datetime
    secret: str | None = Field(
        None, description="The tenant's signing secret, shown only in the response that made it (the first "
        "endpoint); POST /webhooks/secret makes a new one.")


class WebhookEndpointList(ListResponse):
    data: list[WebhookEndpoint]


class WebhookSecret(_Response):
    object: Literal["webhook_secret"] = "webhook_secret"
    secret: str = Field(..., description="`whsec_<base64>`: verify each delivery's `webhook-signature` with it "
                        "(Standard Webhooks, as OpenAI's SDK does). Shown once.")


class WebhookAttempt(_Response):
    attempt: int
    at: datetime
    status_code: int | None = None
    error: str | None = None
    seconds: float


class WebhookDelivery(_Response):
    object: Literal["webhook_delivery"] = "webhook_delivery"
    id: int
    event_id: str
    type: str
    url: str
    status: Literal["pending", "delivered", "failed", "cancelled"]
    attempts: list[WebhookAttempt]
    created_at: datetime
    delivered_at: datetime | None = None
    next_attempt_at: datetime | None = None


class WebhookDeliveryList(ListResponse):
    data: list[WebhookDelivery]
