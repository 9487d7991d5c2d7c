"""The Ray Serve deployment: the FastAPI app plus the scheduler thread of each replica.

Deployed by `eft up` (api/local.py) or by a Serve config (`deploy/serve.yaml`,
import path `eft.api.deployment:app`). Each replica opens the job store, serves the API, and
runs a scheduler pass every `EFT_SCHEDULER_INTERVAL_S` (and at once after it stores a job); replicas coordinate only through the
store's compare-and-set claims.
"""

from __future__ import annotations

import gc
import logging
import threading

from ray import serve

from eft.api.app import create_app
from eft.api.inference import ModelServer, ServeModels
from eft.service import credentials, isolation, jsonlog
from eft.service.jobs import JobService
from eft.service.launcher import RayJobsLauncher
from eft.service.scheduler import Scheduler
from eft.service.settings import Settings, get_settings
from eft.service.store import Store
from eft.service.requests.prepare import helper_imports, validate_job_isolated

log = logging.getLogger("eft.deployment")


def build_service(settings: Settings) -> tuple[JobService, Scheduler]:
    store = Store(settings.resolved_database_url)
    launcher = RayJobsLauncher(settings)
    scheduler = Scheduler(store, launcher, settings, validate_job_isolated)
    return JobService(store, launcher, settings, on_created=scheduler.wake), scheduler


@serve.deployment(ray_actor_options={"num_cpus": 0}, health_check_period_s=10)
@serve.ingress()
class EftService:
    def __init__(self, models: serve.handle.DeploymentHandle | None = None) -> None:
        jsonlog.configure()
        credentials.load()  # the secrets file EFT_SECRETS_FILE names, if any
        settings = get_settings()
        self.job_service, self.scheduler = build_service(settings)
        self.models = None if models is None else ServeModels(
            models, settings.inference_start_timeout_s, settings.inference_retry_after_s)
        isolation.warm(helper_imports)
        self._thread = threading.Thread(
            target=self.scheduler.run_forever, name="eft-scheduler", daemon=True
        )
        self._thread.start()
        from eft.service.webhook_sender import WebhookSender

        self.webhooks = WebhookSender(self.job_service.store.engine, settings)
        self._webhook_thread = threading.Thread(target=self.webhooks.run_forever, name="eft-webhooks", daemon=True)
        self._webhook_thread.start()
        log.info("eft service replica up; store %s", settings.resolved_database_url.split("@")[-1])

    def __serve_build_asgi_app__(self):  # noqa: ANN204 - Serve builds the app per replica
        app = create_app(self.job_service, self.models)
        # What the replica made to start (modules, the app, the store) lives as long as it does:
        # leave it out of every later garbage collection, which then looks at requests' objects
        # only (a full collection over the whole heap is a pause every request waits behind).
        gc.collect()
        gc.freeze()
        return app

    def check_health(self) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the scheduler thread stopped")
        if not self._webhook_thread.is_alive():
            raise RuntimeError("the webhook sender thread stopped")
        if not self.webhooks.healthy():
            raise RuntimeError("the webhook sender has not made a pass in a while")

    def __del__(self) -> None:
        self.scheduler.stop()
        self.webhooks.stop()


app = EftService.bind(ModelServer.bind())
