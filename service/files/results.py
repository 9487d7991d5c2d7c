"""A succeeded job's result file, as OpenAI's fine-tuning jobs list in `result_files`: its step
metrics as CSV (`step,train_loss,valid_loss,...`), a file of the job's tenant with purpose
`fine-tune-results`, readable with `GET /v1/files/{id}/content` (`client.files.content`).

Its id follows from the job's (the job id's hex and `0000`), so `/v1` names it without a lookup;
the job's driver writes it when the job succeeds, and reading it writes it first if it is not
there (a job that succeeded before result files existed)."""

from __future__ import annotations

import csv
import io
import logging

from eft.service.files.store import FileNotFound, FileRecord, FileStore, RESULTS_PURPOSE
from eft.service.store.store import JobRecord, Store
from eft.types.jobs import JobStatus

log = logging.getLogger("eft.result_files")

#: CSV column -> the metric it holds.
COLUMNS = {"step": None, "train_loss": "loss", "valid_loss": "eval_loss", "learning_rate": "learning_rate",
           "tokens_per_s": "tokens_per_s", "trained_tokens": "trained_tokens", "grad_norm": "grad_norm"}


def result_file_id(job_id: str) -> str:
    return f"file-{job_id.removeprefix('ftjob-')}0000"


def job_of(file_id: str) -> str | None:
    """The job a result file id names, or None when it is not one."""
    hexpart = file_id.removeprefix("file-")
    if file_id.startswith("file-") and len(hexpart) == 24 and hexpart.endswith("0000"):
        return f"ftjob-{hexpart[:-4]}"
    return None


def metrics_csv(store: Store, job_id: str) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for row in store.list_metrics(job_id):
        values = row["values"]
        writer.writerow([row["step"], *("" if values.get(m) is None else values[m] for m in list(COLUMNS.values())[1:])])
    return out.getvalue().encode()


def ensure(files: FileStore, store: Store, job: JobRecord) -> FileRecord:
    """The job's result file, written now if it is not there yet."""
    file_id = result_file_id(job.id)
    try:
        return files.get(file_id, job.tenant)
    except FileNotFound:
        pass
    if job.status is not JobStatus.succeeded:
        raise FileNotFound(file_id)
    return files.save(job.tenant, f"{job.id}-step_metrics.csv", RESULTS_PURPOSE,
                      io.BytesIO(metrics_csv(store, job.id)), file_id=file_id)
