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
from eft.service.launcher import submission_id_for
from eft.service.store import Store

#: Seconds between looks at a job that has no Ray Job yet (validating, queued, restarting).
WAIT_POLL_S = 1.0


def sse(data: str, event: str | None = None) -> str:
    """One server-sent event; multi-line data becomes several `data:` fields."""
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


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

    async def follow(self, job_id: str, tenant: str, attempt: int | None = None) -> AsyncIterator[str]:
        """Server-sent events: `data:` per log line of each attempt as it runs (the given one
        only, when `attempt` is set), `attempt` when one starts, and `end` with the final
        status once the job is over. Raises JobNotFound before the first event."""
        self.store.get_job(job_id, tenant)
        if attempt is not None:
            self._submission(job_id, tenant, attempt)
        return self._events(job_id, tenant, attempt)

    async def _events(self, job_id: str, tenant: str, only_attempt: int | None) -> AsyncIterator[str]:
        followed: set[str] = set()
        while True:
            job = await asyncio.to_thread(self.store.get_job, job_id, tenant)
            submission_id = (submission_id_for(job_id, only_attempt) if only_attempt
                             else job.submission_id)
            if submission_id and submission_id not in followed:
                followed.add(submission_id)
                yield sse(json.dumps({"attempt": only_attempt or job.attempt,
                                      "ray_submission_id": submission_id}), event="attempt")
                try:
                    async for chunk in self.launcher.client.tail_job_logs(submission_id):
                        for line in chunk.splitlines():
                            yield sse(line)
                except Exception as exc:  # noqa: BLE001 - Ray lost the attempt; say so, go on
                    yield sse(json.dumps({"ray_submission_id": submission_id,
                                          "message": f"logs unavailable: {exc}"}), event="error")
                if only_attempt:
                    job = await asyncio.to_thread(self.store.get_job, job_id, tenant)
                    yield sse(json.dumps({"status": job.status.value}), event="end")
                    return
                continue
            if job.status.is_terminal:
                yield sse(json.dumps({"status": job.status.value}), event="end")
                return
            yield ": waiting for the job's next Ray Job\n\n"
            await asyncio.sleep(WAIT_POLL_S)
