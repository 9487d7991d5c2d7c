"""eft: the client of the elastic fine-tuning service (light: no torch, ray or fastapi).

    import eft

    client = eft.Client()  # reads EFT_BASE_URL and EFT_API_KEY
    job = client.jobs.create(model="tiny-llama", training_file="data/train.jsonl")
    print(client.jobs.wait(job.id).status)

The same from a shell: `eft jobs create --model tiny-llama --training-file data/train.jsonl --wait`.
"""

# The names below load on first use (PEP 562), so that `import eft.training` in a Ray worker
# does not pay for the client's HTTP stack.
_EXPORTS = {
    "CheckpointPolicy": "eft.types.jobs",
    "FullMethod": "eft.types.jobs",
    "Health": "eft.types.jobs",
    "Hyperparameters": "eft.types.jobs",
    "Job": "eft.types.jobs",
    "JobCreate": "eft.types.jobs",
    "JobError": "eft.types.jobs",
    "JobEvent": "eft.types.jobs",
    "JobEventList": "eft.types.jobs",
    "JobList": "eft.types.jobs",
    "JobMetric": "eft.types.jobs",
    "JobMetricList": "eft.types.jobs",
    "JobStatus": "eft.types.jobs",
    "LoraMethod": "eft.types.jobs",
    "QloraMethod": "eft.types.jobs",
    "Scaling": "eft.types.jobs",
    "APIConnectionError": "eft._errors",
    "APIStatusError": "eft._errors",
    "APITimeoutError": "eft._errors",
    "AuthenticationError": "eft._errors",
    "BadRequestError": "eft._errors",
    "ConflictError": "eft._errors",
    "DownloadError": "eft._errors",
    "EftError": "eft._errors",
    "InternalServerError": "eft._errors",
    "NotFoundError": "eft._errors",
    "PayloadTooLargeError": "eft._errors",
    "PermissionDeniedError": "eft._errors",
    "RateLimitError": "eft._errors",
    "UnprocessableEntityError": "eft._errors",
    "WaitTimeoutError": "eft._errors",
    "AsyncClient": "eft.client",
    "AsyncJobPage": "eft.client",
    "Client": "eft.client",
    "JobPage": "eft.client",
    "__version__": "eft.client",
}


def __getattr__(name: str):  # noqa: ANN202
    if name in _EXPORTS:
        from importlib import import_module

        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'eft' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])


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
