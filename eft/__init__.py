"""eft: the client of the elastic fine-tuning service (light: no torch, ray or fastapi).

    import eft

    client = eft.Client()  # reads EFT_BASE_URL and EFT_API_KEY
    job = client.jobs.create(model="tiny-llama", training_file="data/train.jsonl")
    print(client.jobs.wait(job.id).status)

The same from a shell: `eft jobs create --model tiny-llama --training-file data/train.jsonl --wait`.
"""

from eft.types.jobs import (
    CheckpointPolicy,
    FullMethod,
    Health,
    Hyperparameters,
    Job,
    JobCreate,
    JobError,
    JobEvent,
    JobEventList,
    JobList,
    JobMetric,
    JobMetricList,
    JobStatus,
    LoraMethod,
    QloraMethod,
    Scaling,
)
from eft._errors import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    AuthenticationError,
    BadRequestError,
    ConflictError,
    EftError,
    InternalServerError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    RateLimitError,
    UnprocessableEntityError,
    WaitTimeoutError,
)
from eft.client import AsyncClient, AsyncJobPage, Client, JobPage, __version__

__all__ = [
    "APIConnectionError",
    "APIStatusError",
    "APITimeoutError",
    "AsyncClient",
    "AsyncJobPage",
    "AuthenticationError",
    "BadRequestError",
    "CheckpointPolicy",
    "Client",
    "ConflictError",
    "EftError",
    "FullMethod",
    "Health",
    "Hyperparameters",
    "InternalServerError",
    "Job",
    "JobCreate",
    "JobError",
    "JobEvent",
    "JobEventList",
    "JobList",
    "JobMetric",
    "JobMetricList",
    "JobPage",
    "JobStatus",
    "LoraMethod",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "QloraMethod",
    "RateLimitError",
    "Scaling",
    "UnprocessableEntityError",
    "WaitTimeoutError",
    "__version__",
]
