"""What one service replica runs besides its routes: the job service they call, the scheduler
that validates, dispatches and reconciles jobs, and the sender of webhooks, each pass in its
own thread. Built here, so that the validation the scheduler runs and every other wire between
the rooms of the service is laid inside the service (api/deployment.py starts one per replica)."""

from __future__ import annotations

import logging
import threading

from eft.service import isolation
from eft.service.jobs.manager import JobService
from eft.service.requests.prepare import helper_imports, validate_job_isolated
from eft.service.runs.launcher import Launcher, RayJobsLauncher
from eft.service.scheduling.scheduler import Scheduler
from eft.service.settings import Settings
from eft.service.store.store import Store
from eft.service.webhooks.sender import WebhookSender

log = logging.getLogger("eft.replica")


class Replica:
    """One replica's service, scheduler and webhook sender, on one store."""

    def __init__(self, settings: Settings, launcher: Launcher | None = None):
        store = Store(settings.resolved_database_url)
        launcher = launcher or RayJobsLauncher(settings)
        self.scheduler = Scheduler(store, launcher, settings, validate_job_isolated)
        self.job_service = JobService(store, launcher, settings, on_created=self.scheduler.wake)
        self.webhooks = WebhookSender(store.engine, settings)
        self.threads = (threading.Thread(target=self.scheduler.run_forever, name="eft-scheduler", daemon=True),
                        threading.Thread(target=self.webhooks.run_forever, name="eft-webhooks", daemon=True))

    def start(self, warm_helpers: bool = True) -> None:
        """Start the scheduler's and the sender's threads, after (unless told not to) the helper
        processes that check tenants' inputs, so that the first job validated waits for none."""
        if warm_helpers:
            isolation.warm(helper_imports)
        for thread in self.threads:
            thread.start()

    def problem(self) -> str | None:
        """Why this replica is unhealthy (a stopped thread, a sender that made no pass in a
        while), or None."""
        for thread in self.threads:
            if not thread.is_alive():
                return f"the {thread.name} thread stopped"
        if not self.webhooks.healthy():
            return "the webhook sender has not made a pass in a while"
        return None

    def stop(self) -> None:
        self.scheduler.stop()
        self.webhooks.stop()
