"""`GET /metrics`: the service's Prometheus metrics (service/metrics.py)."""

from __future__ import annotations

import time

from fastapi import APIRouter, FastAPI, Request, Response

from eft.api.deps import JobServiceDep
from eft.service import metrics

router = APIRouter(tags=["metrics"])


@router.get("/metrics", response_class=Response)
def prometheus_metrics(service: JobServiceDep) -> Response:
    """Prometheus text exposition: requests, scheduler timings, jobs by status, queue depth."""
    return Response(metrics.render(service.store), media_type=metrics.CONTENT_TYPE)


def install(app: FastAPI) -> None:
    """Count every request by route template and status, and time it."""

    @app.middleware("http")
    async def count_requests(request: Request, call_next):  # noqa: ANN001, ANN202
        started = time.perf_counter()
        status = 500
        try:
            response = await call_next(request)
            status = response.status_code
            return response
        finally:
            route = request.scope.get("route")
            template = getattr(route, "path", None)
            if template is None:
                # Mounted static files set no route; anything else unmatched is one label, so
                # random paths cannot grow the series count.
                template = "/ui/static/{path}" if request.url.path.startswith("/ui/static/") else "unmatched"
            metrics.observe_request(request.method, template, status, time.perf_counter() - started)

    app.include_router(router)
