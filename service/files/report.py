"""A full validation report of one dataset, for `POST /files/{id}/validate` (no job made).

Every line is read; schema problems (per format, roles and turn order, empty content) are named
by file, line and field, capped at `max_problems` with the total kept; duplicates and overlap
with a validation file are warnings. With a tokenizer it adds token counts (min, max, mean, how
many are cut at `max_seq_len`) and, for the first record, which tokens carry the loss.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from eft.types.files import DatasetProblem, DatasetReport, LossToken, TokenStats
from eft.training.formats import check_record, iter_records

MAX_EXAMPLE_TOKENS = 256


def _fingerprint(record: Any) -> str:
    return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()


def fingerprints(path: Path) -> dict[str, int]:
    """Record fingerprint -> first line number, for records that parse."""
    seen: dict[str, int] = {}
    for lineno, record, error in iter_records(path, utf8_errors_per_line=True):
        if error is None:
            seen.setdefault(_fingerprint(record), lineno)
    return seen


class _Collector:
    def __init__(self, name: str, cap: int):
        self.name, self.cap, self.total = name, cap, 0
        self.errors: list[DatasetProblem] = []
        self.warnings: list[DatasetProblem] = []

    def error(self, line: int, field: str, message: str, code: str = "invalid_record") -> None:
        self.total += 1
        if len(self.errors) < self.cap:
            self.errors.append(DatasetProblem(file=self.name, line=line, field=field,
                                              message=message, code=code))

    def warn(self, line: int, field: str, message: str, code: str) -> None:
        if len(self.warnings) < self.cap:
            self.warnings.append(DatasetProblem(file=self.name, line=line, field=field,
                                                message=message, code=code))


def check_dataset(path: Path, name: str, *, max_problems: int = 20, tokenizer: Any = None,
                  max_seq_len: int = 512, other: Path | None = None,
                  other_name: str | None = None) -> DatasetReport:
    """Read every line of `path` and report. `other` is the validation file to compare with."""
    found = _Collector(name, max_problems)
    formats: dict[str, int] = {}
    seen: dict[str, int] = {}
    good: list[tuple[int, Any]] = []
    records = 0
    for lineno, record, parse_error in iter_records(path, utf8_errors_per_line=True):
        records += 1
        if parse_error:
            found.error(lineno, "line", parse_error, "invalid_json")
            continue
        fmt, problems = check_record(record)
        for field, message in problems:
            found.error(lineno, field, message)
        if problems or fmt is None:
            continue
        formats[fmt] = formats.get(fmt, 0) + 1
        key = _fingerprint(record)
        if key in seen:
            found.warn(lineno, "record", f"duplicates line {seen[key]}", "duplicate")
        else:
            seen[key] = lineno
        good.append((lineno, record))
    if records == 0:
        found.error(0, "file", "has no records", "empty_file")
    if len(formats) > 1:
        found.warn(0, "file", f"mixes formats {sorted(formats)}: one format per file is usual",
                   "mixed_formats")
    if other is not None:
        _overlap(found, seen, other, other_name or other.name)
    report = DatasetReport(file=name, ok=found.total == 0, records=records, formats=formats,
                           errors=found.errors, errors_total=found.total, warnings=found.warnings)
    if tokenizer is not None and good:
        report.tokens, report.example = _token_stats(found, good, tokenizer, max_seq_len)
        report.max_seq_len = max_seq_len
        report.errors_total, report.ok = found.total, found.total == 0
        report.errors, report.warnings = found.errors, found.warnings
    return report


def _overlap(found: _Collector, seen: dict[str, int], other: Path, other_name: str) -> None:
    shared = {k: line for k, line in fingerprints(other).items() if k in seen}
    if shared:
        lines = sorted(seen[k] for k in shared)
        found.warn(lines[0], "record", f"{len(shared)} record(s) also in {other_name} (lines "
                   f"{', '.join(map(str, lines[:5]))}{', ...' if len(lines) > 5 else ''}): the "
                   "validation loss will look better than it is", "train_validation_overlap")


def _token_stats(found: _Collector, good: list[tuple[int, Any]], tokenizer: Any,
                 max_seq_len: int) -> tuple[TokenStats, list[LossToken]]:
    from eft.training.chat import TemplateError
    from eft.training.data import IGNORE_INDEX, Example, tokenize_preference, tokenize_record
    from eft.training.formats import is_preference

    lengths, loss_total, example = [], 0, None

    for lineno, record in good:
        try:
            if is_preference(record):  # both conversations count; the chosen one is shown
                pair = tokenize_preference(tokenizer, record, 1 << 30)
                sequences = [pair.chosen, pair.rejected]
            else:
                sequences = [tokenize_record(tokenizer, record, 1 << 30)]
        except TemplateError as exc:
            found.error(lineno, exc.field, str(exc), f"chat_{exc.rule}")
            continue
        cuts = [Example(s.input_ids[:max_seq_len], s.labels[:max_seq_len]) for s in sequences]  # as a job truncates
        cut = cuts[0]
        lengths.append(sum(len(s.input_ids) for s in sequences))
        loss_total += sum(c.loss_tokens for c in cuts)
        if min(c.loss_tokens for c in cuts) == 0:
            found.warn(lineno, "record", f"has no trained token within max_seq_len={max_seq_len}, so "
                       "a job leaves it out: raise max_seq_len or shorten the prompt", "no_loss_tokens")
        if example is None:
            example = [LossToken(token=tokenizer.decode([t]), id=t, loss=label != IGNORE_INDEX)
                       for t, label in list(zip(cut.input_ids, cut.labels))[:MAX_EXAMPLE_TOKENS]]
    if not lengths:
        return TokenStats(min=0, max=0, mean=0.0, truncated=0, total=0, loss_tokens=0), []
    stats = TokenStats(min=min(lengths), max=max(lengths), mean=round(sum(lengths) / len(lengths), 1),
                       truncated=sum(1 for n in lengths if n > max_seq_len), total=sum(lengths),
                       loss_tokens=loss_total)
    return stats, example or []
