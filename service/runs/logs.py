"""A job's driver logs, from Ray Jobs: all at once, or followed as server-sent events.

Ray Jobs captures each attempt's driver output (the driver's own lines, Ray Train's controller
and, with Ray's default log forwarding, the workers'); `JobSubmissionClient.get_job_logs` and
`tail_job_logs` read it back from the cluster's dashboard.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from eft.service.errors import Conflict
from eft.service.runs.launcher import submission_id_for
from eft.service.store.store import Store
from eft.types.text import decimal_int

#: Seconds between looks at a job that has no Ray Job yet (validating, queued, restarting).
WAIT_POLL_S = 1.0


class LogStreams:
    """Open log streams per tenant in this replica: at most `per_tenant` at once (one more is a
    429), each open for at most `max_seconds` (then an `end` event with `"reason":
    "stream_time_limit"`; reconnect with `Last-Event-ID` to go on). One tenant's followers can
    then hold neither the replica's connections nor its event loop for ever."""

    def __init__(self, per_tenant: int, max_seconds: float):
        from eft.service.accounts.ratelimit import TenantSlots

        self.slots, self.max_seconds = TenantSlots(per_tenant, retry_after_s=5), max_seconds

    def bounded(self, tenant: str, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        """`events`, counted against `tenant` and cut at the time limit. Raises RateLimited
        (before any byte is sent) when the tenant already holds its streams."""
        self.slots.take(tenant, f"tenant {tenant!r} already follows {self.slots.per_tenant} log streams on this "
                        "server: close one, or read the logs without follow=true")
        return self._counted(tenant, events)

    async def _counted(self, tenant: str, events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[dict[str, Any]]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.max_seconds
        try:
            async for event in events:
                yield event
                if loop.time() > deadline:
                    yield {"event": "end", "data": json.dumps({"reason": "stream_time_limit"})}
                    return
        finally:
            self.slots.give_back(tenant)


def parse_event_id(value: str | None) -> tuple[int, int] | None:
    """(attempt, line) of a `Last-Event-ID` this stream sent (`<attempt>:<line>`), else None."""
    attempt, _, line = (value or "").partition(":")
    parsed = decimal_int(attempt), decimal_int(line)
    return parsed if None not in parsed else None


class JobLogs:
    def __init__(self, store: Store, launcher: Any):
        self.store, self.launcher = store, launcher

    def _submission(self, job_id: str, tenant: str, attempt: int | None) -> tuple[str, int]:
        job = self.store.get_job(job_id, tenant)
        if attempt is not None:
            if attempt < 1 or attempt > job.attempt:
                raise Conflict(f"job {job_id} has attempts 1 to {job.attempt}; pass one of them",
                               code="attempt_not_found", param="attempt")
            return submission_id_for(job_id, attempt), attempt
        if not job.submission_id:
            raise Conflict(f"job {job_id} is {job.status.value} and has not started on Ray yet; "
                           "retry once it runs, or pass follow=true to wait for its logs",
                           code="logs_not_available", param="job_id")
        return job.submission_id, job.attempt

    def text(self, job_id: str, tenant: str, attempt: int | None = None,
             tail: int | None = None) -> dict[str, Any]:
        """The logs of one attempt (the latest by default). Raises Conflict before it ran."""
        submission_id, attempt = self._submission(job_id, tenant, attempt)
        text = self.launcher.logs(submission_id)
        if tail is not None:
            text = "\n".join(text.splitlines()[-tail:])
        return {"object": "fine_tuning.job.logs", "job_id": job_id, "attempt": attempt,
                "ray_submission_id": submission_id, "data": text}

    async def follow(self, job_id: str, tenant: str, attempt: int | None = None,
                     last_event_id: str | None = None) -> AsyncIterator[dict[str, Any]]:
        """Server-sent events, as dicts for sse-starlette: one event per log line of each
        attempt as it runs (the given one only, when `attempt` is set), with the id
        `<attempt>:<line>`; `attempt` when one starts, and `end` with the final status once the
        job is over. A reconnect that sends `Last-Event-ID` resumes after that line. Raises
        JobNotFound before the first event."""
        self.store.get_job(job_id, tenant)
        if attempt is not None:
            self._submission(job_id, tenant, attempt)
        return self._events(job_id, tenant, attempt, parse_event_id(last_event_id))

    async def _events(self, job_id: str, tenant: str, only_attempt: int | None,
                      resume: tuple[int, int] | None) -> AsyncIterator[dict[str, Any]]:
        followed: set[str] = set()
        while True:
            job = await asyncio.to_thread(self.store.get_job, job_id, tenant)
            number = only_attempt or job.attempt
            submission_id = submission_id_for(job_id, number) if only_attempt else job.submission_id
            if resume is not None and number < resume[0]:
                followed.add(submission_id or "")  # an attempt the reader has seen to its end
            if submission_id and submission_id not in followed:
                followed.add(submission_id)
                skip = resume[1] if resume is not None and resume[0] == number else 0
                yield {"event": "attempt", "data": json.dumps({"attempt": number, "ray_submission_id": submission_id})}
                async for event in self._attempt_lines(submission_id, number, skip):
                    yield event
                if only_attempt:
                    job = await asyncio.to_thread(self.store.get_job, job_id, tenant)
                    yield {"event": "end", "data": json.dumps({"status": job.status.value})}
                    return
                continue
            if job.status.is_terminal:
                yield {"event": "end", "data": json.dumps({"status": job.status.value})}
                return
            yield {"comment": "waiting for the job's next Ray Job"}
            await asyncio.sleep(WAIT_POLL_S)

    async def _attempt_lines(self, submission_id: str, attempt: int, skip: int) -> AsyncIterator[dict[str, Any]]:
        """The attempt's log lines from Ray Jobs, numbered from 1, after the first `skip`."""
        number = 0
        try:
            async for chunk in self.launcher.client.tail_job_logs(submission_id):
                for line in chunk.splitlines():
                    number += 1
                    if number > skip:
                        yield {"id": f"{attempt}:{number}", "data": line}
        except Exception as exc:  # noqa: BLE001 - Ray lost the attempt; say so, go on
            yield {"event": "error", "data": json.dumps({"ray_submission_id": submission_id,
                                                         "message": f"logs unavailable: {exc}"})}
