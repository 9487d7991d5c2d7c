"""The Ray Serve deployment: the FastAPI app plus the scheduler thread of each replica.

Deployed by `eft up` (api/local.py) or by a Serve config (`deploy/serve.yaml`,
import path `eft.api.deployment:app`). Each replica opens the job store, serves the API, and
runs a scheduler pass every `EFT_SCHEDULER_INTERVAL_S` (and at once after it stores a job); replicas coordinate only through the
store's compare-and-set claims.
"""

from __future__ import annotations

import gc
import logging

from ray import serve

from eft.api.app import create_app
from eft.api.inference import ModelServer, ServeModels
from eft.service import credentials, jsonlog
from eft.service.jobs.replica import Replica
from eft.service.settings import get_settings

log = logging.getLogger("eft.deployment")


@serve.deployment(ray_actor_options={"num_cpus": 0}, health_check_period_s=10)
@serve.ingress()
class EftService:
    def __init__(self, models: serve.handle.DeploymentHandle | None = None) -> None:
        jsonlog.configure()
        credentials.load()  # the secrets file EFT_SECRETS_FILE names, if any
        settings = get_settings()
        self.replica = Replica(settings)
        self.models = None if models is None else ServeModels(
            models, settings.inference_start_timeout_s, settings.inference_retry_after_s)
        self.replica.start()
        log.info("eft service replica up; store %s", settings.resolved_database_url.split("@")[-1])

    def __serve_build_asgi_app__(self):  # noqa: ANN204 - Serve builds the app per replica
        app = create_app(self.replica.job_service, self.models)
        # What the replica made to start (modules, the app, the store) lives as long as it does:
        # leave it out of every later garbage collection, which then looks at requests' objects
        # only (a full collection over the whole heap is a pause every request waits behind).
        gc.collect()
        gc.freeze()
        return app

    def check_health(self) -> None:
        problem = self.replica.problem()
        if problem:
            raise RuntimeError(problem)

    def __del__(self) -> None:
        self.replica.stop()


app = EftService.bind(ModelServer.bind())
