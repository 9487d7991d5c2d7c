"""Uploads meet jobs: which tenant may name a file id in a job, and the validate-only report."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from eft.types.files import DatasetReport, ValidateRequest
from eft.service import isolation
from eft.service.files.report import check_dataset
from eft.service.errors import Problem, RequestInvalid
from eft.service.files.store import FILE_ID, FileNotFound, FileRecord, FileStore
from eft.service.settings import Settings
from eft.service.requests.resolve import resolve_model
from eft.service.requests.templates import request_tokenizer, tokenizer_problem


def check_job_files(body: Any, tenant: str | None, files: FileStore, conn: Any = None) -> None:
    """Refuse (422) a job naming a file id that is not this tenant's (or does not exist), as
    `file_not_found`: another tenant's file is indistinguishable from a missing one. With
    `conn`, read in that connection's transaction (the create's own)."""
    problems = []
    for param in ("training_file", "validation_file"):
        value = getattr(body, param, None)
        if isinstance(value, str) and FILE_ID.match(value):
            try:
                files.get(value, tenant, conn)
            except FileNotFound:
                problems.append(Problem(param, "file_not_found",
                                        f"no file with id {value!r}: upload it with POST /files, "
                                        "or list yours with GET /files"))
    if problems:
        raise RequestInvalid(problems=problems)


def owned_inputs(body: dict[str, Any], scope: str | None, files: FileStore) -> tuple[dict[str, Any], list[Problem]]:
    """A raw request body with every file id the caller does not own taken out, and a
    `file_not_found` problem for each: what the 422 handler may then read and quote."""
    body, problems = dict(body), []
    for param in ("training_file", "validation_file"):
        value = body.get(param)
        if isinstance(value, str) and FILE_ID.match(value):
            try:
                files.get(value, scope)
            except FileNotFound:
                del body[param]
                problems.append(Problem(param, "file_not_found", f"no file with id {value!r}: upload it "
                                        "with POST /files, or list yours with GET /files"))
    return body, problems


def validate_upload(files: FileStore, record: FileRecord, req: ValidateRequest, tenant: str | None,
                    settings: Settings) -> DatasetReport:
    """The full report of one upload. Raises RequestInvalid for an unknown model or
    validation file; FileNotFound passes through."""
    problems: list[Problem] = []
    model_path = resolve_model(req.model, settings, problems) if req.model else None
    other = other_name = None
    if req.validation_file:
        try:
            other_record = files.get(req.validation_file, tenant)
            other, other_name = Path(other_record.path), other_record.filename
        except FileNotFound:
            problems.append(Problem("validation_file", "file_not_found",
                                    f"no file with id {req.validation_file!r}: see GET /files"))
    if problems:
        raise RequestInvalid(problems=problems)
    # The whole read (and tokenisation) in a helper process: it takes seconds on a large file.
    report = isolation.run(check_dataset_with, Path(record.path), record.filename, model_path,
                           max_problems=settings.max_validation_errors, max_seq_len=req.max_seq_len,
                           other=other, other_name=other_name, param="file_id")
    if isinstance(report, Problem):
        raise RequestInvalid(problems=[report])
    return report


def check_dataset_with(path: Path, name: str, model_path: str | None, **options: Any) -> DatasetReport | Problem:
    """`check_dataset` with the model's tokenizer, if any, loaded (once) in this process; the
    problem instead where that tokenizer cannot load."""
    try:
        if model_path is None:
            return check_dataset(path, name, **options)
        unavailable = tokenizer_problem(model_path)
        if unavailable is not None:
            return unavailable
        with request_tokenizer(model_path) as tokenizer:
            return check_dataset(path, name, tokenizer=tokenizer, **options)
    except csv.Error as exc:  # a file the CSV reader gives up on: the uploader's to fix
        return Problem("file_id", "file_unreadable", f"cannot read {name!r} as UTF-8 CSV: {exc}")
