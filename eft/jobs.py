"""`client.jobs`: create, inspect, cancel, follow and wait for fine-tuning jobs (sync and async)."""

from __future__ import annotations

import inspect
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from eft._base import create_body, list_params
from eft._resource import AsyncAPIResource, SyncAPIResource
from eft._errors import WaitTimeoutError
from eft.types.webhooks import WebhookDeliveryList
from eft.types.jobs import (
    Export,
    ExportList,
    Job,
    JobCheckpointList,
    JobCreate,
    JobEventList,
    JobList,
    JobLogs,
    JobMetric,
    JobMetricList,
    JobStatus,
)


ProgressCallback = Callable[[Job, JobMetric | None], Any]


class JobPage:
    """One page of `jobs.list`; `.data` is this page, iterating yields jobs of every later page."""

    def __init__(self, body: JobList, fetch: Callable[[str], JobPage]):
        self.body = body
        self.data, self.has_more, self.next_cursor = body.data, body.has_more, body.next_cursor
        self._fetch = fetch

    def next_page(self) -> JobPage | None:
        """Return the following page, or None on the last one."""
        return self._fetch(self.next_cursor) if self.has_more and self.next_cursor else None

    def __iter__(self) -> Iterator[Job]:
        page: JobPage | None = self
        while page is not None:
            yield from page.data
            page = page.next_page()


class AsyncJobPage:
    """Async twin of `JobPage`: `async for job in page` walks every later page."""

    def __init__(self, body: JobList, fetch: Callable[[str], Awaitable[AsyncJobPage]]):
        self.body = body
        self.data, self.has_more, self.next_cursor = body.data, body.has_more, body.next_cursor
        self._fetch = fetch

    async def next_page(self) -> AsyncJobPage | None:
        """Return the following page, or None on the last one."""
        return await self._fetch(self.next_cursor) if self.has_more and self.next_cursor else None

    async def __aiter__(self) -> AsyncIterator[Job]:
        page: AsyncJobPage | None = self
        while page is not None:
            for job in page.data:
                yield job
            page = await page.next_page()


class Jobs(SyncAPIResource):
    """`client.jobs`: create, inspect, cancel and wait for fine-tuning jobs."""

    def create(self, request: JobCreate | Mapping[str, Any] | None = None, **fields: Any) -> Job:
        """Submit a job (POST /jobs); `fields` override `request`. Returns the new `Job`.

        Raises pydantic.ValidationError before sending when the request is invalid, and
        `EftError` subclasses for what the service answers.
        """
        return self._request("POST", "/jobs", cast=Job, json=create_body(request, fields),
                                     idempotency_key=str(uuid.uuid4()))

    def retrieve(self, job_id: str) -> Job:
        """Return the job (GET /jobs/{id}); raises `NotFoundError` when there is none."""
        return self._request("GET", f"/jobs/{job_id}", cast=Job)

    def list(self, limit: int = 20, after: str | None = None, status: JobStatus | str | None = None) -> JobPage:
        """Return the first page of jobs, newest first; iterate it to walk every page."""
        body = self._request("GET", "/jobs", cast=JobList, params=list_params(limit, after, status))
        return JobPage(body, lambda cursor: self.list(limit=limit, after=cursor, status=status))

    def cancel(self, job_id: str) -> Job:
        """Ask the job to stop (POST /jobs/{id}/cancel); returns it, usually `cancelling`."""
        return self._request("POST", f"/jobs/{job_id}/cancel", cast=Job)

    def pause(self, job_id: str) -> Job:
        """Pause the job (POST /jobs/{id}/pause): it checkpoints at once and releases its
        workers; returns it `pausing` (then `paused`), or `paused` when it was queued."""
        return self._request("POST", f"/jobs/{job_id}/pause", cast=Job)

    def resume(self, job_id: str) -> Job:
        """Queue a paused job again (POST /jobs/{id}/resume); it continues from its pause
        checkpoint with as many workers as the cluster gives."""
        return self._request("POST", f"/jobs/{job_id}/resume", cast=Job)

    def webhooks(self, job_id: str) -> WebhookDeliveryList:
        """The job's webhook deliveries, each with every attempt (GET /jobs/{id}/webhooks)."""
        return self._request("GET", f"/jobs/{job_id}/webhooks", cast=WebhookDeliveryList)

    def list_events(self, job_id: str, after: int | None = None, limit: int = 100) -> JobEventList:
        """Return the job's events with id greater than `after`, oldest first."""
        return self._request("GET", f"/jobs/{job_id}/events", cast=JobEventList,
                                     params={"after": after, "limit": limit})

    def metrics(self, job_id: str, *, after_step: int | None = None, limit: int | None = None) -> JobMetricList:
        """Return the job's reported training metrics, oldest step first (a page of at most
        `limit` steps after `after_step`; `has_more` says whether more follow)."""
        params = {k: v for k, v in {"after_step": after_step, "limit": limit}.items() if v is not None}
        return self._request("GET", f"/jobs/{job_id}/metrics", cast=JobMetricList, params=params or None)

    def checkpoints(self, job_id: str) -> JobCheckpointList:
        """Return every checkpoint the job saved, oldest first (`available` once pruned: False)."""
        return self._request("GET", f"/jobs/{job_id}/checkpoints", cast=JobCheckpointList)

    def download(self, job_id: str, dest: str | os.PathLike, checkpoint: int | None = None,
                 merged: bool = False) -> list[Path]:
        """Write the job's artifact (or its checkpoint of step `checkpoint`, or with `merged` its
        merged export) under `dest`, each file checked against the size and SHA-256 the service
        lists; returns the paths. Raises `DownloadError` on a mismatch, `ConflictError` before
        the job succeeded (or the merged export is written)."""
        from eft.downloads import download

        return download(self, job_id, dest, checkpoint, "merged" if merged else None)

    def export(self, job_id: str, kind: str = "merged", hub_repo: str | None = None,
               hub_private: bool = True) -> Export:
        """Start exporting the job's model (`merged`: base + adapter as one model), and pushing
        it to the Hugging Face Hub repository `hub_repo` if given; returns the export (the one
        already running or done, if any)."""
        return self._request("POST", f"/jobs/{job_id}/export", cast=Export,
                                     json={"kind": kind, "hub_repo": hub_repo, "hub_private": hub_private})

    def exports(self, job_id: str) -> ExportList:
        """The job's exports and their status."""
        return self._request("GET", f"/jobs/{job_id}/exports", cast=ExportList)

    def wait_export(self, job_id: str, kind: str = "merged", poll_interval_s: float = 1.0,
                    timeout_s: float | None = None, hub_repo: str | None = None) -> Export:
        """Export (if not yet asked) and poll until the export of `kind` has succeeded or
        failed; returns it. Raises `WaitTimeoutError` past `timeout_s`."""
        started = time.monotonic()
        export = self.export(job_id, kind, hub_repo)
        while export.status == "running":
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                raise WaitTimeoutError(f"export {export.id} of {job_id} still running after {timeout_s} s")
            self._sleep(poll_interval_s)
            export = next(e for e in self.exports(job_id).data if e.id == export.id)
        return export

    def manifest(self, job_id: str) -> dict[str, Any]:
        """Return the artifact's `eft_manifest.json`; raises `ConflictError` before it exists."""
        return self._request_json("GET", f"/jobs/{job_id}/manifest")

    def logs(self, job_id: str, attempt: int | None = None, tail: int | None = None) -> JobLogs:
        """Return the driver logs of the job's latest attempt (or `attempt`), from Ray Jobs."""
        return self._request("GET", f"/jobs/{job_id}/logs", cast=JobLogs,
                                     params={"attempt": attempt, "tail": tail})

    def follow_logs(self, job_id: str, attempt: int | None = None) -> Iterator[str]:
        """Yield the job's log lines as they are written, until the job ends (server-sent
        events from GET /jobs/{id}/logs?follow=true). A dropped connection is resumed from the
        last line received (`Last-Event-ID`), up to `max_retries` times. Raises `EftError`."""
        for event in self._events(f"/jobs/{job_id}/logs", {"follow": "true", "attempt": attempt}):
            if event.event == "end":
                return
            if event.event is None:  # a log line; other events tell of attempts
                yield event.data

    def wait(self, job_id: str, poll_interval_s: float = 1.0, timeout_s: float | None = None,
             on_progress: ProgressCallback | None = None) -> Job:
        """Poll until the job is succeeded, failed or cancelled and return it.

        `on_progress(job, latest_metric_or_None)` is called after every poll. Raises
        `WaitTimeoutError` (carrying the last job) after `timeout_s`, and `EftError` subclasses.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.retrieve(job_id)
            if on_progress is not None:
                points = self.metrics(job_id).data
                on_progress(job, points[-1] if points else None)
            if job.status.is_terminal:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(job, timeout_s)
            self._sleep(poll_interval_s)


class AsyncJobs(AsyncAPIResource):
    """`async_client.jobs`: the coroutine twin of `Jobs`; see it for each method's contract."""

    async def create(self, request: JobCreate | Mapping[str, Any] | None = None, **fields: Any) -> Job:
        return await self._request("POST", "/jobs", cast=Job, json=create_body(request, fields),
                                           idempotency_key=str(uuid.uuid4()))

    async def retrieve(self, job_id: str) -> Job:
        return await self._request("GET", f"/jobs/{job_id}", cast=Job)

    async def list(self, limit: int = 20, after: str | None = None,
                   status: JobStatus | str | None = None) -> AsyncJobPage:
        body = await self._request("GET", "/jobs", cast=JobList, params=list_params(limit, after, status))
        return AsyncJobPage(body, lambda cursor: self.list(limit=limit, after=cursor, status=status))

    async def cancel(self, job_id: str) -> Job:
        return await self._request("POST", f"/jobs/{job_id}/cancel", cast=Job)

    async def webhooks(self, job_id: str) -> WebhookDeliveryList:
        return await self._request("GET", f"/jobs/{job_id}/webhooks", cast=WebhookDeliveryList)

    async def pause(self, job_id: str) -> Job:
        return await self._request("POST", f"/jobs/{job_id}/pause", cast=Job)

    async def resume(self, job_id: str) -> Job:
        return await self._request("POST", f"/jobs/{job_id}/resume", cast=Job)

    async def list_events(self, job_id: str, after: int | None = None, limit: int = 100) -> JobEventList:
        return await self._request("GET", f"/jobs/{job_id}/events", cast=JobEventList,
                                           params={"after": after, "limit": limit})

    async def metrics(self, job_id: str, *, after_step: int | None = None, limit: int | None = None) -> JobMetricList:
        params = {k: v for k, v in {"after_step": after_step, "limit": limit}.items() if v is not None}
        return await self._request("GET", f"/jobs/{job_id}/metrics", cast=JobMetricList, params=params or None)

    async def checkpoints(self, job_id: str) -> JobCheckpointList:
        return await self._request("GET", f"/jobs/{job_id}/checkpoints", cast=JobCheckpointList)

    async def download(self, job_id: str, dest: str | os.PathLike, checkpoint: int | None = None,
                       merged: bool = False) -> list[Path]:
        from eft.downloads import download_async

        return await download_async(self, job_id, dest, checkpoint, "merged" if merged else None)

    async def export(self, job_id: str, kind: str = "merged", hub_repo: str | None = None,
                     hub_private: bool = True) -> Export:
        return await self._request("POST", f"/jobs/{job_id}/export", cast=Export,
                                           json={"kind": kind, "hub_repo": hub_repo, "hub_private": hub_private})

    async def exports(self, job_id: str) -> ExportList:
        return await self._request("GET", f"/jobs/{job_id}/exports", cast=ExportList)

    async def wait_export(self, job_id: str, kind: str = "merged", poll_interval_s: float = 1.0,
                          timeout_s: float | None = None, hub_repo: str | None = None) -> Export:
        started = time.monotonic()
        export = await self.export(job_id, kind, hub_repo)
        while export.status == "running":
            if timeout_s is not None and time.monotonic() - started > timeout_s:
                raise WaitTimeoutError(f"export {export.id} of {job_id} still running after {timeout_s} s")
            await self._sleep(poll_interval_s)
            export = next(e for e in (await self.exports(job_id)).data if e.id == export.id)
        return export

    async def manifest(self, job_id: str) -> dict[str, Any]:
        return await self._request_json("GET", f"/jobs/{job_id}/manifest")

    async def logs(self, job_id: str, attempt: int | None = None, tail: int | None = None) -> JobLogs:
        return await self._request("GET", f"/jobs/{job_id}/logs", cast=JobLogs,
                                           params={"attempt": attempt, "tail": tail})

    async def follow_logs(self, job_id: str, attempt: int | None = None) -> AsyncIterator[str]:
        """`async for line in client.jobs.follow_logs(job_id)`: as `Jobs.follow_logs`."""
        async for event in self._events(f"/jobs/{job_id}/logs", {"follow": "true", "attempt": attempt}):
            if event.event == "end":
                return
            if event.event is None:
                yield event.data

    async def wait(self, job_id: str, poll_interval_s: float = 1.0, timeout_s: float | None = None,
                   on_progress: ProgressCallback | None = None) -> Job:
        """Poll until the job is terminal and return it; `on_progress` may be sync or async."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = await self.retrieve(job_id)
            if on_progress is not None:
                points = (await self.metrics(job_id)).data
                result = on_progress(job, points[-1] if points else None)
                if inspect.isawaitable(result):
                    await result
            if job.status.is_terminal:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(job, timeout_s)
            await self._sleep(poll_interval_s)
