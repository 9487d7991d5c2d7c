"""`GET /metrics`: the service's Prometheus metrics (service/metrics.py)."""

from __future__ import annotations

from fastapi import APIRouter, FastAPI, Response

from eft.api.deps import JobServiceDep
from eft.service import metrics
router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
def prometheus_metrics(service: JobServiceDep) -> Response:
    """Prometheus text exposition: requests, scheduler timings, jobs by status, queue depth."""
    return Response(service.prometheus(), media_type=metrics.CONTENT_TYPE)


def install(app: FastAPI) -> None:
    """Serve `/metrics` (requests are counted and timed by `api/middleware.RequestContext`)."""
    app.include_router(router)
