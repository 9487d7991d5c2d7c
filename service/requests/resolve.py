"""Stage 1 of a job request: resolve the names it gives. The model (a bundled name, a directory
under an allowed model root, or a Hub id where the server allows them) and each dataset (a path
under an allowed data root, an uploaded `file-...`, or `hf://datasets/...`), each dataset scanned
whole against its schema once per file version (in a helper process). Serving resolves model
names here too. Problems are collected, not raised: the request answers all of them at once."""

from __future__ import annotations

import csv
import functools
import re
from pathlib import Path

from eft.service.requests import hub
from eft.service.errors import Problem, RequestInvalid
from eft.service.files.store import FILE_ID, uploaded_path
from eft.service.requests.paths import HUB_ID, resolve_under_roots
from eft.service.settings import Settings
from eft.training.formats import ScanResult, content_bytes, data_kind, is_dataset_dir, scan_jsonl


URI = re.compile(r"^[a-z][a-z0-9+.-]*://")


def _roots_hint(roots: list[Path]) -> str:
    return ", ".join(str(r) for r in roots)


def resolve_model(value: str, settings: Settings, problems: list[Problem]) -> str | None:
    roots = settings.allowed_model_roots
    path = resolve_under_roots(value, roots)
    if path is not None and (path / "config.json").is_file():
        return str(path)
    if settings.allow_hub_models and HUB_ID.match(value) and not Path(value).is_absolute():
        snapshot, problem = hub.snapshot(value, settings)
        if problem is not None:
            problems.append(problem)
            return None
        return str(snapshot)
    bundled = sorted(
        p.parent.name for r in roots if r.is_dir() for p in r.glob("*/config.json")
    )
    problems.append(Problem(
        "model", "model_not_found",
        f"unknown model {value!r}: name a bundled model ({', '.join(bundled) or 'none built'}) or "
        f"a Hugging Face model directory under an allowed model root ({_roots_hint(roots)})",
    ))
    return None


def resolve_dataset(value: str, param: str, settings: Settings, problems: list[Problem],
                    columns: dict[str, str] | None = None) -> Path | None:
    """Resolve and fully scan one dataset (JSONL, Parquet, CSV file or `datasets` directory);
    every problem found is appended."""
    roots = settings.allowed_data_roots
    if value.startswith("hf://datasets/") and settings.allow_hub_models:
        path, problem = hub.dataset_file(value, param, settings)
        if problem is not None:
            problems.append(problem)
            return None
    elif URI.match(value):
        problems.append(Problem(param, "unsupported_uri", "remote URIs are not enabled on this "
                                "server: upload the file under an allowed data root"
                                + ("" if settings.allow_hub_models else
                                   " (hf://datasets/... needs EFT_ALLOW_HUB_MODELS=true)")))
        return None
    elif FILE_ID.match(value):
        path = uploaded_path(value, settings)
        path = path if path.exists() else None
    else:
        path = resolve_under_roots(value, roots)
    if path is None:
        problems.append(Problem(param, "file_not_found",
                                f"{value!r} is not a file under an allowed data root "
                                f"({_roots_hint(roots)}): check the path"))
        return None
    if path.is_dir() and not is_dataset_dir(path):
        problems.append(Problem(param, "not_a_file", f"{value!r} is a directory but not a `datasets` "
                                "save_to_disk directory: name a JSONL, Parquet or CSV file, or such a directory"))
        return None
    if content_bytes(path) > settings.max_dataset_bytes:
        problems.append(Problem(param, "file_too_large",
                                f"{value!r} exceeds {settings.max_dataset_bytes} bytes"))
        return None
    try:
        scan = scan_cached(path, settings.max_validation_errors, columns)
    except RequestInvalid as exc:  # the scan passed its helper's limits: this field's input
        problems.extend(Problem(param, p.code, p.message) for p in exc.problems)
        return None
    except (OSError, UnicodeDecodeError, ValueError, csv.Error) as exc:
        kind = {"parquet": "Parquet", "csv": "UTF-8 CSV", "arrow": "a `datasets` directory"}.get(
            data_kind(path), "UTF-8 JSONL")
        problems.append(Problem(param, "file_unreadable", f"cannot read {value!r} as {kind}: {exc}"))
        return None
    for p in scan.problems:
        problems.append(Problem(f"{param}:line {p.line}:{p.field}", "invalid_record",
                                f"{path.name} line {p.line}: {p.field} {p.message}"))
    if scan.problems_total > len(scan.problems):
        problems.append(Problem(param, "more_problems",
                                f"{scan.problems_total - len(scan.problems)} more problem(s) not listed"))
    if scan.records == 0:
        problems.append(Problem(param, "empty_file", f"{value!r} has no records"))
    return path if not scan.problems_total and scan.records else None


def scan_cached(path: Path, max_problems: int, columns: dict[str, str] | None = None) -> ScanResult:
    """`scan_jsonl`, remembered while the file is unchanged (same inode, size and mtime; for a
    directory, of its newest file): jobs that reuse a dataset are checked once, on the request
    path and in the scheduler alike."""
    stats = [p.stat() for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path.stat()]
    key = (len(stats), sum(st.st_size for st in stats), max((st.st_mtime_ns for st in stats), default=0))
    st = path.stat()
    return _scan(str(path.resolve()), st.st_ino, key, max_problems, tuple(sorted((columns or {}).items())))


@functools.lru_cache(maxsize=64)
def _scan(path: str, _ino: int, _key: tuple[int, int, int], max_problems: int,
          columns: tuple[tuple[str, str], ...]) -> ScanResult:
    from eft.service import isolation
    # In a helper process: a scan of a large file must not hold this replica's interpreter.
    return isolation.run(scan_jsonl, Path(path), max_problems, dict(columns))
