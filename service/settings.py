"""Service settings: one pydantic-settings object read from `EFT_*` environment variables.

Every process of a job (the Serve replica, the Ray Job driver, the Train controller) reads the same
variables; the launcher forwards them to the driver, so a job runs with the settings of the
service that dispatched it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_ASSETS = REPO_ROOT / "assets"


def _default_home() -> Path:
    return Path.home() / ".eft"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="EFT_", extra="ignore")

    home: Path = Field(default_factory=_default_home, description="Root of local state.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; defaults to a SQLite file under home."
    )
    data_roots: list[Path] = Field(
        default_factory=list,
        description="Directories training data may be read from (JSON list). The bundled "
        "assets/data and <home>/data are always allowed.",
    )
    model_roots: list[Path] = Field(
        default_factory=list,
        description="Directories base models may be loaded from. The bundled assets/models and "
        "<home>/models are always allowed.",
    )
    allow_hub_models: bool = Field(
        False, description="Accept Hugging Face hub ids (needs network on every worker)."
    )
    checkpoint_root: str | None = Field(None, description="Ray Train storage_path; <home>/checkpoints.")
    artifact_root: Path | None = Field(None, description="Where adapters land; <home>/artifacts.")

    ray_address: str = Field("auto", description="Ray cluster address for the service's ray.init.")
    ray_dashboard_url: str = Field(
        "http://127.0.0.1:8265", description="Ray Jobs API (dashboard) address."
    )
    host: str = "127.0.0.1"
    port: int = 8000

    gpu_memory_gb: float = Field(80.0, gt=0, description="Memory of one GPU worker, for the planner.")
    gpu_type: str | None = Field(None, description="e.g. A100 or H100: lets the planner use FlashAttention.")
    cpu_worker_memory_gb: float | None = Field(
        None, gt=0, description="Memory budget of one CPU worker; default 80% of RAM / workers."
    )

    max_running_jobs: int = Field(4, ge=1, description="Jobs dispatched at once, cluster-wide.")
    max_running_jobs_per_tenant: int = Field(2, ge=1)
    scheduler_interval_s: float = Field(1.0, gt=0)
    # Recovery and elasticity (passed on to every job's driver).
    resize_interval_s: float = Field(
        30.0, ge=1, description="How often a running elastic job looks for room to grow."
    )
    preemption_poll_interval_s: float = Field(
        2.0, gt=0, description="How often Ray Train looks for drained (preempted) nodes."
    )
    worker_start_timeout_s: float = Field(
        30.0, ge=5, description="How long a worker group may take to start before it is retried "
        "(a node that just left can still look free for a while)."
    )
    max_validation_errors: int = Field(20, ge=1, description="Problems listed per dataset.")
    max_dataset_bytes: int = Field(2 * 1024**3, ge=1)

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home / 'eft.db'}"

    @property
    def resolved_checkpoint_root(self) -> str:
        return self.checkpoint_root or str(self.home / "checkpoints")

    @property
    def resolved_artifact_root(self) -> Path:
        return self.artifact_root or self.home / "artifacts"

    @property
    def allowed_data_roots(self) -> list[Path]:
        roots = [*self.data_roots, BUNDLED_ASSETS / "data", self.home / "data"]
        return [r.expanduser().resolve() for r in roots]

    @property
    def allowed_model_roots(self) -> list[Path]:
        roots = [*self.model_roots, BUNDLED_ASSETS / "models", self.home / "models"]
        return [r.expanduser().resolve() for r in roots]

    def driver_environment(self) -> dict[str, str]:
        """The `EFT_*` variables a job's driver needs to act with this service's settings."""
        env = {
            "EFT_HOME": str(self.home),
            "EFT_DATABASE_URL": self.resolved_database_url,
            "EFT_CHECKPOINT_ROOT": self.resolved_checkpoint_root,
            "EFT_ARTIFACT_ROOT": str(self.resolved_artifact_root),
            "EFT_RESIZE_INTERVAL_S": str(self.resize_interval_s),
            "EFT_PREEMPTION_POLL_INTERVAL_S": str(self.preemption_poll_interval_s),
            "EFT_WORKER_START_TIMEOUT_S": str(self.worker_start_timeout_s),
            # Ray Train reads these in the driver and hands them to its controller and workers.
            "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": str(self.preemption_poll_interval_s),
            "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": str(self.worker_start_timeout_s),
        }
        return env


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()
