"""Service settings: one pydantic-settings object read from `EFT_*` environment variables.

Every process of a job (the Serve replica, the Ray Job driver, the Train controller) reads the same
variables; the launcher forwards them to the driver, so a job runs with the settings of the
service that dispatched it, all but the credentials, which each process reads on its own node
(service/credentials.py).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from eft.service import credentials
from eft.training.storage import storage_environment

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_ASSETS = REPO_ROOT / "assets"


def _default_home() -> Path:
    return Path.home() / ".eft"


class TenantShare(BaseModel):
    weight: float = Field(1.0, gt=0)
    guaranteed: int = Field(0, ge=0)
    #: The highest priority this tenant's jobs may ask for (named ones count as low 0, normal 50,
    #: high 100): a request above it is refused, naming the limit.
    max_priority: int = Field(100, ge=0, le=100)


class Prices(BaseModel):
    """What one worker hour costs (a worker is one GPU, or `cpus_per_worker` CPUs)."""

    gpu_hour: float = Field(0.0, ge=0)
    spot_gpu_hour: float = Field(0.0, ge=0)
    cpu_hour: float = Field(0.0, ge=0)
    spot_cpu_hour: float = Field(0.0, ge=0)
    currency: str = "USD"

    def per_hour(self, spot: bool, gpu: bool) -> float:
        kind = "gpu" if gpu else "cpu"
        return getattr(self, f"spot_{kind}_hour" if spot else f"{kind}_hour")


class NodeGroup(BaseModel):
    """A node group the autoscaler can grow (KubeRay worker group, cluster launcher node type):
    the custom resources its nodes carry, the worker slots one node holds and the most nodes it
    may have. A job whose minimum fits only once the group has grown is still dispatched: Ray's
    autoscaler adds the nodes its workers wait for."""

    resources: dict[str, float] = Field(default_factory=dict)
    gpus_per_node: int = Field(0, ge=0)
    slots_per_node: int = Field(1, ge=1, description="Workers one node holds (its GPUs, or CPUs / cpus_per_worker).")
    max_nodes: int = Field(0, ge=0)
    spot: bool = False
    #: The GPU type its nodes have, as Ray names it (`H100`, `A100-80G`, ...): the memory of one
    #: GPU decides which jobs its slots may hold before any of its nodes is up.
    gpu_type: str | None = None


class StorageSettings(BaseModel):
    """Where the service keeps its state: the home folder, the job store's database and its pool, and the roots of checkpoints, artifacts and uploads."""

    home: Path = Field(default_factory=_default_home, description="Root of local state.")
    secrets_file: Path | None = Field(
        None, description="A dotenv file of credentials (EFT_DATABASE_URL, object-store keys, "
        "EFT_ADMIN_API_KEY) that every process of the service reads on its own node; only its "
        "path travels through Ray (service/credentials.py).")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL; defaults to a SQLite file under home.")
    db_pool_size: int = Field(5, ge=1, description="Pooled connections per process (PostgreSQL).")
    db_max_overflow: int = Field(10, ge=0, description="Extra connections beyond the pool at peaks.")
    db_pool_recycle_s: int = Field(
        1800, ge=-1, description="Replace pooled connections older than this (-1: never); keep "
        "it below any idle timeout of a proxy or load balancer in front of the database.")
    checkpoint_root: str | None = Field(
        None, description="Ray Train storage_path: a directory or an s3://, gs://, abfs:// URI "
        "(credentials from the environment); <home>/checkpoints.")
    artifact_root: str | None = Field(
        None, description="Where adapters land: a directory or object-store URI; <home>/artifacts.")
    files_root: str | None = Field(
        None, description="Where uploaded files are kept: a local or shared-filesystem directory "
        "that every node mounts at the same path (not an object store); <home>/files.")


class InputSettings(BaseModel):
    """What a tenant may name as a model or dataset: the allowed roots, Hugging Face Hub ids and the Hub's limits, and the bounds of a dataset's checks."""

    data_roots: list[Path] = Field(
        default_factory=list,
        description="Directories training data may be read from (JSON list). The bundled "
        "assets/data and <home>/data are always allowed.")
    model_roots: list[Path] = Field(
        default_factory=list,
        description="Directories base models may be loaded from. The bundled assets/models and "
        "<home>/models are always allowed.")
    allow_hub_models: bool = Field(
        False, description="Accept Hugging Face hub ids: resolved to a pinned revision through the "
        "Hugging Face cache on the request path (config and tokenizer), the weights downloaded "
        "once per node by the workers.")
    hub_cache_dir: Path | None = Field(
        None, description="Hugging Face cache directory for hub models (default: huggingface_hub's, "
        "HF_HUB_CACHE); a shared file system lets every node read one download.")
    hub_offline: bool = Field(
        False, description="Use only hub models already in the cache (as HF_HUB_OFFLINE does)."
    )
    hub_timeout_s: float = Field(
        2.0, gt=0, le=60, description="Seconds to wait for the Hub when resolving a model id."
    )
    hub_endpoint: str | None = Field(
        None, description="The Hugging Face Hub that Hub ids are read from and exports push to (default: "
        "huggingface.co; a private Hub's URL)."
    )
    hub_push_namespaces: dict[str, list[str]] = Field(
        default_factory=dict, description="Hub namespaces (users or organisations) each tenant's exports may "
        "push to with the operator's token, as JSON: {\"acme\": [\"acme-models\"]}. A tenant not named pushes "
        "nowhere; a push never goes into an existing repository the tenant's exports did not create.")
    hub_read_repos: dict[str, list[str]] = Field(
        default_factory=dict, description="Hub repositories (`org/name`) or organisations (`org/*`) each tenant "
        "may read with the operator's token, as JSON (private or gated models and datasets). Every other Hub "
        "id a tenant names is fetched anonymously, by the service and the workers alike.")
    hub_max_service_bytes: int = Field(
        64 * 1024**2, ge=1, description="Bytes of a Hub model's or dataset's files the service downloads for "
        "one request (config, tokenizer, template; a dataset file), checked from the Hub's listing first.")
    max_validation_errors: int = Field(20, ge=1, description="Problems listed per dataset.")
    max_dataset_bytes: int = Field(2 * 1024**3, ge=1)


class ClusterSettings(BaseModel):
    """The hardware the planner and the scheduler count on: GPU memory and type, node groups, spot resources, and what workers may ask Ray for."""

    ray_dashboard_url: str = Field(
        "http://127.0.0.1:8265", description="Ray Jobs API (dashboard) address."
    )
    gpu_memory_gb: float = Field(80.0, gt=0, description="Memory of one GPU worker, for the planner.")
    gpu_type: str | None = Field(None, description="e.g. A100 or H100: lets the planner use FlashAttention.")
    peak_tflops_per_worker: float | None = Field(
        None, gt=0, description="Peak TFLOP/s of one worker, for MFU; default by gpu_type, 1 on CPU "
        "(training/telemetry.py)."
    )
    cpu_worker_memory_gb: float | None = Field(
        None, gt=0, description="Memory budget of one CPU worker; default 80% of RAM / workers."
    )
    node_groups: dict[str, NodeGroup] = Field(
        default_factory=dict, description="The autoscaler's node groups and their maximum size, as JSON: "
        '{"gpu-spot": {"resources": {"spot": 1}, "gpus_per_node": 8, "slots_per_node": 8, "max_nodes": 4, '
        '"spot": true}}. Groups with no node up yet count at their maximum for admission.')
    gpu_memory_by_type: dict[str, float] = Field(
        default_factory=dict, description="GB of memory of one GPU per Ray accelerator type, as JSON "
        '({"A100": 80}), over the built-in table (eft.service.scheduling.capacity.GPU_MEMORY_GB): a GPU job is placed '
        "only on GPU types with at least its planned memory per worker.")
    spot_resources: list[str] = Field(
        default_factory=lambda: ["spot"], description="Custom resources that mark a node as spot "
        "(its slots are used for growth, the minimums go on on-demand nodes first).")
    allowed_worker_resources: list[str] = Field(
        default_factory=lambda: ["spot"], description="Custom Ray resources a job may ask for in "
        "`scaling.resources` (JSON list), e.g. the labels of your spot and on-demand node groups. "
        "Anything else, Ray's per-node `node:<ip>` resources included, is refused."
    )
    mlflow_tracking_uri: str | None = Field(
        None, description="MLflow tracking URI for jobs with trackers.mlflow; file:<home>/mlruns."
    )


class SchedulingSettings(BaseModel):
    """How the scheduler shares the cluster: job slots, tenants' weights and guaranteed shares, the policy, prices, and how often it looks."""

    max_running_jobs: int = Field(4, ge=1, description="Jobs dispatched at once, cluster-wide.")
    max_running_jobs_per_tenant: int = Field(2, ge=1)
    tenant_shares: dict[str, TenantShare] = Field(
        default_factory=dict, description="Each tenant's weight in the cluster's fair share, the running "
        "jobs it is guaranteed and the highest priority its jobs may ask for, as JSON: "
        '{"team-a": {"weight": 2, "guaranteed": 1, "max_priority": 50}}; others weigh 1, up to priority 100.')
    scheduling: str = Field(
        "elastic", pattern="^(elastic|count)$", description="How queued jobs are admitted: `elastic` "
        "reads the cluster's capacity (Ray's nodes and `EFT_NODE_GROUPS`), starts a job only when its "
        "minimum workers can be placed, and sizes elastic jobs across the cluster (eft.service.scheduling.policy); "
        "`count` dispatches by the job limits alone.")
    prices: Prices = Field(
        default_factory=Prices, description="Prices per worker hour for estimates and usage, as JSON: "
        '{"gpu_hour": 2.5, "spot_gpu_hour": 0.9, "cpu_hour": 0.05, "spot_cpu_hour": 0.02, "currency": "USD"}; '
        "0 (the default) reports hours only.")
    scheduler_goodput: bool = Field(
        True, description="Size elastic jobs by their measured scaling (tokens/s per world size they have run "
        "at): a job that is no faster on more workers is not grown. Off: every job counts as scaling linearly.")
    resize_cost_s: float = Field(
        20.0, ge=0, description="What resizing a running job costs it (checkpoint, restart, reload): the "
        "scheduler grows a running job only when the time it saves exceeds twice this, and a new job waits "
        "for a running job's completion rather than shrink others when that wait costs less.")
    scheduler_interval_s: float = Field(
        1.0, gt=0, description="Seconds between scheduler passes (a created job starts one at once)."
    )
    reconcile_interval_s: float = Field(
        5.0, gt=0, description="How often the scheduler asks Ray whether running jobs' drivers are alive."
    )
    dispatch_grace_s: float = Field(
        60.0, gt=0, description="How long a claimed job may have no Ray Job (its submit on its way) "
        "before it counts as lost and is queued again."
    )
    dispatch_paused: bool = Field(
        False, description="Validate and queue new jobs but start none (maintenance windows); "
        "running jobs go on."
    )


class RecoverySettings(BaseModel):
    """Recovery and elasticity, passed on to every job's driver: how often a job looks for room to grow and for preemption notices, and how long its workers may take to start."""

    resize_interval_s: float = Field(
        30.0, ge=1, description="How often a running elastic job looks for room to grow."
    )
    preemption_poll_interval_s: float = Field(
        2.0, gt=0, description="How often Ray Train looks for drained (preempted) nodes."
    )
    train_poll_interval_s: float = Field(
        0.5, gt=0, le=10, description="How often a job's Ray Train controller polls its workers "
        "(Ray's default is 2 s): it takes one report per worker per poll, so checkpoints closer "
        "than this wait, and a failed worker is noticed within it."
    )
    worker_start_timeout_s: float = Field(
        30.0, ge=5, description="How long a worker group may take to start before it is retried "
        "(a node that just left can still look free for a while)."
    )


class ApiSettings(BaseModel):
    """The HTTP surface: where it listens, the bootstrap admin key, body limits, its threads, and each tenant's request rate and open streams."""

    host: str = "127.0.0.1"
    port: int = 8000
    admin_api_key: str | None = Field(
        None, description="A bootstrap admin key (not stored) for a deployment's first `eft keys create`."
    )
    admin_tenant: str = Field("default", description="Tenant that the bootstrap admin key creates in.")
    max_upload_bytes: int = Field(512 * 1024**2, ge=1, description="Largest file POST /files accepts.")
    max_request_bytes: int = Field(1024**2, ge=1, description="Largest JSON request body.")
    api_threads: int = Field(
        8, ge=1, le=256, description="Threads a replica runs its blocking request work on (database "
        "reads and writes, checks); further requests wait their turn. One interpreter runs one "
        "thread at a time: many threads only take turns more often, and a thread that holds a "
        "lock (the database writer's) waits longer for its turn."
    )
    requests_per_s_per_tenant: float = Field(
        50.0, gt=0, description="Sustained API requests per second a tenant may make (per replica); "
        "past it, 429 with Retry-After."
    )
    request_burst_per_tenant: int = Field(200, ge=1, description="Requests a tenant may make at once "
                                          "before the rate limit applies.")
    log_streams_per_tenant: int = Field(8, ge=1, description="Log streams (follow=true) a tenant may "
                                        "hold open at once on one replica.")
    log_stream_max_s: float = Field(3600.0, gt=0, description="How long one log stream stays open "
                                    "before it ends (the client reconnects with Last-Event-ID).")


class QuotaSettings(BaseModel):
    """What one tenant may hold at once: active jobs and the CPUs and GPUs they ask for, uploads, exports and generations."""

    max_active_jobs_per_tenant: int = Field(
        20, ge=1, description="Queued plus running jobs a tenant may have (per-tenant row overrides)."
    )
    max_cpus_per_tenant: float = Field(256.0, gt=0, description="CPUs a tenant's active jobs may ask for.")
    max_gpus_per_tenant: float = Field(64.0, ge=0, description="GPUs a tenant's active jobs may ask for.")
    quota_retry_after_s: int = Field(30, ge=1, description="Retry-After of a 429 over quota.")
    max_files_per_tenant: int = Field(1000, ge=1, description="Uploads a tenant may keep.")
    max_file_bytes_per_tenant: int = Field(
        20 * 1024**3, ge=1, description="Bytes of uploads a tenant may keep (413 past it)."
    )
    exports_per_tenant: int = Field(
        2, ge=1, le=1000, description="Exports of one tenant's jobs running at once (one more is a 429).")
    generations_per_tenant: int = Field(
        4, ge=1, description="Completions (/v1/chat/completions, /v1/completions) a tenant may have in flight at "
        "once on one replica; one more is a 429 with Retry-After, so that one tenant cannot queue the model "
        "servers full ahead of the others.")
    generation_tokens_per_minute: int = Field(
        200_000, ge=0, description="Completion tokens a tenant may ask for per minute on one replica (charged "
        "max_tokens x n up front, the unused part refunded); 0: no limit.")


class ServingSettings(BaseModel):
    """The model servers behind `/v1`: how long a first load may take, adapters per base model, default lengths."""

    inference_start_timeout_s: float = Field(
        120.0, gt=0, description="How long a completion request waits for a model server replica "
        "(one starts when none runs: they scale to zero when idle) before it answers 503 with "
        "Retry-After."
    )
    inference_retry_after_s: int = Field(10, ge=1, description="Retry-After of that 503.")
    inference_max_adapters: int = Field(
        8, ge=1, description="Fine-tuned adapters a model server replica keeps loaded per base "
        "model; the least recently used one is dropped past it."
    )
    inference_default_max_tokens: int = Field(
        512, ge=1, description="Tokens a completion generates when the request sets no max_tokens "
        "(fewer when the context has less room)."
    )
    inference_engine: Literal["auto", "vllm", "transformers"] = Field(
        "auto", description="The model servers' engine: vLLM where it is installed and loads the model, else "
        "transformers' (auto); vLLM only (vllm); transformers' generate, one request at a time (transformers).")
    inference_max_lora_rank: int = Field(64, ge=1, le=512, description="The largest LoRA rank vLLM serves (it sizes "
                                         "its buffers for it); a higher one is refused with 409.")
    inference_adapters_per_batch: int = Field(4, ge=1, le=64, description="Different adapters vLLM batches at once.")
    inference_max_model_len: int = Field(4096, ge=16, description="The longest prompt and completion a model server "
                                         "takes (at most the model's context): a bound on one request's KV cache.")
    inference_kv_cache_gb: float = Field(1.0, gt=0, description="A vLLM engine's KV cache on a CPU node, in GiB.")
    inference_gpu_memory_utilization: float = Field(0.85, gt=0, le=1, description="The share of its GPU a vLLM "
                                                    "engine takes for weights, adapters and KV cache.")


class IsolationSettings(BaseModel):
    """The helper processes that work on tenants' inputs: their time and memory bounds (service/isolation.py)."""

    helper_time_s: float = Field(
        60.0, gt=0, le=3600, description="Time the service spends on one request's input in a helper process "
        "(scanning a file, rendering its chats with the model's template, inspecting a model); past it the "
        "request is a 422 input_too_costly and the helper is replaced.")
    helper_validate_time_s: float = Field(
        900.0, gt=0, le=86400, description="Time a job's validation (tokenising its data) may take in the helper; "
        "past it the job fails as a user error (input_too_costly).")
    helper_memory_mb: int = Field(
        4096, ge=256, le=1 << 20, description="Resident memory a helper process may hold while it works on one "
        "request's input or one job's validation; past it the call fails as EFT_HELPER_TIME_S does.")


class WebhookSettings(BaseModel):
    """Webhooks: which addresses are allowed, retries, timeouts, concurrency and endpoints per tenant."""

    webhook_allow_loopback: bool = Field(
        False, description="Let webhooks go to plain-http loopback URLs (127.0.0.1, localhost): local "
        "mode (`eft up` sets it). Otherwise a webhook URL must be https.")
    webhook_allow_private: bool = Field(
        False, description="Let webhooks go to private, loopback or link-local addresses (a URL whose "
        "host resolves to one is refused otherwise, at creation and at every delivery).")
    webhook_retry_base_s: float = Field(
        5.0, gt=0, description="Wait before the second delivery attempt of a webhook; it doubles with each "
        "failed attempt, up to EFT_WEBHOOK_RETRY_MAX_S.")
    webhook_retry_max_s: float = Field(3600.0, gt=0, description="Longest wait between two delivery attempts.")
    webhook_retry_for_s: float = Field(
        86400.0, gt=0, description="How long a webhook is retried before it is given up (a day).")
    webhook_timeout_s: float = Field(
        10.0, gt=0, description="Time one delivery attempt may take in all (connecting, TLS, sending, and the "
        "answer's status and headers; its body is never read), however the receiver paces its bytes.")
    webhook_dns_timeout_s: float = Field(
        2.0, gt=0, description="Time a webhook URL's host has to resolve, when the URL is given and before each "
        "attempt (off the API's threads).")
    webhook_concurrency: int = Field(8, ge=1, le=256, description="Delivery attempts a replica makes at once.")
    webhook_tenant_concurrency: int = Field(
        2, ge=1, le=256, description="Of those, at most this many for one tenant: tenants' deliveries take turns.")
    webhook_endpoints_per_tenant: int = Field(
        10, ge=1, le=10000, description="Webhook endpoints one tenant may have (POST /webhooks).")
    webhook_poll_interval_s: float = Field(1.0, gt=0, description="How often a replica looks for webhooks due.")


class Settings(BaseSettings, StorageSettings, InputSettings, ClusterSettings, SchedulingSettings, RecoverySettings, ApiSettings, QuotaSettings, ServingSettings, IsolationSettings, WebhookSettings):
    """Every setting of the service, one section per concern (the classes above); each field is
    read from `EFT_<FIELD NAME>` (`EFT_MAX_RUNNING_JOBS`), whichever section declares it."""

    model_config = SettingsConfigDict(env_prefix="EFT_", extra="ignore")

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home / 'eft.db'}"

    @property
    def resolved_checkpoint_root(self) -> str:
        return self.checkpoint_root or str(self.home / "checkpoints")

    @property
    def resolved_artifact_root(self) -> str:
        return self.artifact_root or str(self.home / "artifacts")

    @property
    def resolved_files_root(self) -> str:
        return self.files_root or str(self.home / "files")

    @property
    def resolved_mlflow_tracking_uri(self) -> str:
        return self.mlflow_tracking_uri or (self.home / "mlruns").as_uri()

    @property
    def allowed_data_roots(self) -> list[Path]:
        roots = [*self.data_roots, BUNDLED_ASSETS / "data", self.home / "data"]
        return [r.expanduser().resolve() for r in roots]

    @property
    def allowed_model_roots(self) -> list[Path]:
        roots = [*self.model_roots, BUNDLED_ASSETS / "models", self.home / "models"]
        return [r.expanduser().resolve() for r in roots]

    def driver_environment(self) -> dict[str, str]:
        """The settings a job's driver needs, as variables safe to put in a Ray runtime
        environment: no credential travels (service/credentials.py). The driver finds the
        database URL and object-store keys in its node's environment or in the secrets file
        named here; `EFT_DATABASE_URL_REDACTED` (the URL with its password masked) lets it check
        that it found the service's database, not a default."""
        env = {
            "EFT_HOME": str(self.home),
            "EFT_CHECKPOINT_ROOT": self.resolved_checkpoint_root,
            "EFT_ARTIFACT_ROOT": self.resolved_artifact_root,
            "EFT_FILES_ROOT": self.resolved_files_root,
            "EFT_RESIZE_INTERVAL_S": str(self.resize_interval_s),
            "EFT_PREEMPTION_POLL_INTERVAL_S": str(self.preemption_poll_interval_s),
            "EFT_WORKER_START_TIMEOUT_S": str(self.worker_start_timeout_s),
            # Ray Train reads these in the driver and hands them to its controller and workers.
            "RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S": str(self.preemption_poll_interval_s),
            "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": str(self.worker_start_timeout_s),
            "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": str(self.train_poll_interval_s),
        }
        if self.database_url:
            env["EFT_DATABASE_URL_REDACTED"] = redacted_url(self.database_url)
        if self.hub_endpoint:  # where exports push (the token comes from the node or the secrets file)
            env["EFT_HUB_ENDPOINT"] = self.hub_endpoint
        if self.secrets_file:
            env[credentials.FILE_VAR] = str(self.secrets_file)
        # Read by the driver's telemetry to compute MFU.
        if self.gpu_type:
            env["EFT_GPU_TYPE"] = self.gpu_type
        if self.mlflow_tracking_uri:
            env["EFT_MLFLOW_TRACKING_URI"] = self.mlflow_tracking_uri
        if self.peak_tflops_per_worker:
            env["EFT_PEAK_TFLOPS_PER_WORKER"] = str(self.peak_tflops_per_worker)
        # The object store's endpoint and region, as the service itself has them; its keys
        # come from the secrets file or the node.
        env.update(credentials.split(storage_environment())[0])
        return env


def redacted_url(url: str) -> str:
    """A database URL with its password masked."""
    import sqlalchemy as sa

    return sa.engine.make_url(url).render_as_string(hide_password=True)


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once from the environment."""
    return Settings()


# Settings read before `credentials.load` put the secrets file's values into the environment are stale.
credentials.on_load(get_settings.cache_clear)
