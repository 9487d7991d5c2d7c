"""Wire models of uploaded files and dataset validation reports (pydantic only: the client
reuses them). A file object has the same shape on `/files` and on the OpenAI-compatible
`/v1/files`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from eft.types._base import ListResponse, _Request, _Response


class FileObject(_Response):
    id: str = Field(examples=["file-019a4f2c3b1d5e6f7a8b9c0d"])
    object: Literal["file"] = "file"
    bytes: int
    created_at: int = Field(description="Unix seconds.")
    filename: str
    purpose: str = Field(examples=["fine-tune"])
    status: Literal["uploaded", "processed", "error"] = "processed"
    status_details: str | None = None
    sha256: str


class FileList(ListResponse):
    object: Literal["list"] = "list"
    data: list[FileObject]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None
    next_cursor: str | None = Field(None, description="Pass as `after` for the next page.")


class FileDeleted(_Response):
    id: str
    object: Literal["file"] = "file"
    deleted: bool = True


class DatasetProblem(_Response):
    file: str
    line: int = Field(description="1-based line number; 0 for the file as a whole.")
    field: str
    message: str
    code: str = "invalid_record"


class TokenStats(_Response):
    min: int
    max: int
    mean: float
    truncated: int = Field(description="Examples longer than max_seq_len (cut to it).")
    total: int
    loss_tokens: int


class LossToken(_Response):
    token: str
    id: int
    loss: bool = Field(description="Whether the loss is computed on this token.")


class DatasetReport(_Response):
    """Everything a full pass over a dataset found; `ok` when it can train."""

    object: Literal["dataset.validation"] = "dataset.validation"
    file: str
    ok: bool
    records: int
    formats: dict[str, int]
    errors: list[DatasetProblem]
    errors_total: int
    warnings: list[DatasetProblem]
    tokens: TokenStats | None = None
    max_seq_len: int | None = None
    example: list[LossToken] | None = Field(
        None, description="The first record's tokens, each marked with whether it carries loss.")


class ValidateRequest(_Request):
    model: str | None = Field(
        None, min_length=1, max_length=512,
        description="Tokenize with this model's tokenizer for token counts and the loss example.")
    max_seq_len: int = Field(512, ge=8, le=1_048_576)
    validation_file: str | None = Field(
        None, min_length=1, max_length=64, description="A file id to check for overlap with this one.")
