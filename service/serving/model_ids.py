"""Model ids for what jobs trained, in OpenAI's form: a succeeded job's model is
`ft:<base>:<suffix or tenant>:<job id>`, and each of its checkpoints `<that id>:ckpt-<step>`.

The id names the model; where its files are (`artifact_path`, a checkpoint's `path`) is a
separate field that can change (an operator moving the artifact store) without changing the id.
An id resolves through its job id alone, then must equal the id that job has now: a made-up or
stale id (another base, another suffix) is unknown, as is another tenant's job.
"""

from __future__ import annotations

from dataclasses import dataclass

from eft.types.text import decimal_int

PREFIX = "ft"
CHECKPOINT = "ckpt-"


def _part(value: str) -> str:
    """One `:`-separated part of an id: the value with its colons (and spaces) made dashes."""
    return "-".join(value.replace(":", " ").split())


def fine_tuned_model_id(base: str, job_id: str, suffix: str | None, tenant: str) -> str:
    """The id of the model a job trained: `ft:<base>:<suffix, or the tenant>:<job id>`."""
    return f"{PREFIX}:{_part(base)}:{_part(suffix or '') or _part(tenant)}:{job_id}"


def checkpoint_model_id(model_id: str, step: int) -> str:
    """The id of one checkpoint of that model: `<model id>:ckpt-<step>`."""
    return f"{model_id}:{CHECKPOINT}{step}"


@dataclass(frozen=True)
class ModelRef:
    """What a fine-tuned model id points at: a job, and one of its checkpoints or (None) the
    model the job published."""

    job_id: str
    step: int | None = None


def parse_model_id(value: str) -> ModelRef | None:
    """The job (and checkpoint step) an id names; None when `value` is not a fine-tuned id."""
    parts = value.split(":")
    if len(parts) < 4 or parts[0] != PREFIX:
        return None
    step = None
    last = parts[-1]
    if last.startswith(CHECKPOINT):
        step = decimal_int(last[len(CHECKPOINT):])
        if step is None or len(parts) < 5:
            return None
        parts = parts[:-1]
    if not parts[-1]:
        return None
    return ModelRef(job_id=parts[-1], step=step)
