"""The wire contract of the service: every request and response body, the job statuses and the
error envelope, as pydantic models (pydantic only, nothing heavy).

- `eft.types.jobs`: jobs, events, metrics, checkpoints, plans, errors (`/jobs`, `/plan`)
- `eft.types.files`: uploads and dataset reports (`/files`)
- `eft.types.openai`: the OpenAI-compatible shapes (`/v1`)

The client builds and reads these; the server's routes declare them, so both sides agree by
construction.
"""
