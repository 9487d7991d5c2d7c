"""Hugging Face hub ids as base models: resolved on the request path to a pinned revision.

The service downloads only what it reads (config, tokenizer, chat template) into the Hugging
Face cache and plans and tokenises from that snapshot; the job then carries the repository id
and the commit it resolved to, and every worker loads exactly that revision through the same
cache (one download per node, or one in all on a shared cache directory). Without network, or
with `hub_offline`, only what the cache holds resolves; anything else is a 422 at once.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from eft.service.errors import Problem
from eft.service.settings import Settings

#: What the service reads of a hub model; the weights are the workers' to fetch.
SERVICE_FILES = ["*.json", "*.jinja", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab.*"]


def snapshot(repo_id: str, settings: Settings, revision: str | None = None) -> tuple[Path | None, Problem | None]:
    """The local snapshot directory of `repo_id` at `revision` (default: the main branch's
    current commit), or the problem naming why it cannot be had."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        path = snapshot_download(
            repo_id, revision=revision, allow_patterns=SERVICE_FILES,
            cache_dir=settings.hub_cache_dir, local_files_only=settings.hub_offline,
            etag_timeout=settings.hub_timeout_s,
        )
    except GatedRepoError:
        return None, Problem("model", "hub_model_gated",
                             f"{repo_id!r} is gated on the Hugging Face Hub: accept its license and "
                             "set HF_TOKEN for the service and the workers")
    except RevisionNotFoundError:
        return None, Problem("model", "hub_revision_not_found", f"{repo_id!r} has no revision {revision!r}")
    except RepositoryNotFoundError:
        return None, Problem("model", "hub_model_not_found",
                             f"no model {repo_id!r} on the Hugging Face Hub (or it is private: set HF_TOKEN)")
    except LocalEntryNotFoundError:
        where = settings.hub_cache_dir or "the Hugging Face cache"
        return None, Problem("model", "hub_unreachable",
                             f"{repo_id!r} is not in {where} and the Hub cannot be reached from the "
                             "service (offline): download it once where there is network (for example "
                             "`huggingface-cli download` into that cache), or name a local model directory")
    except (OSError, ValueError) as exc:
        return None, Problem("model", "hub_error", f"cannot fetch {repo_id!r} from the Hub: {exc}")
    return Path(path), None


def hub_source(model_path: str, settings: Settings) -> dict[str, Any] | None:
    """For a snapshot directory of the Hugging Face cache (`.../models--org--name/snapshots/
    <commit>`), how workers load it: repository id, pinned revision and the cache; else None."""
    path = Path(model_path)
    repo = path.parent.parent
    if path.parent.name != "snapshots" or not repo.name.startswith("models--"):
        return None
    return {"repo_id": repo.name[len("models--"):].replace("--", "/"), "revision": path.name,
            "cache_dir": str(repo.parent), "local_files_only": settings.hub_offline}


#: `hf://datasets/<owner>/<name>[@<revision>][/<path in the repository>]`
HUB_DATASET = re.compile(r"^hf://datasets/(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+?))?(?:/(?P<file>.+))?$")
DATA_PATTERNS = ["*.jsonl", "*.json", "*.parquet", "*.csv", "**/*.jsonl", "**/*.json", "**/*.parquet", "**/*.csv"]


def dataset_file(value: str, param: str, settings: Settings) -> tuple[Path | None, Problem | None]:
    """The local file a hub dataset reference names, fetched into the Hugging Face cache at a
    pinned commit (the path holds it). Without a file part the repository must hold exactly one
    data file with "train" in its name (or one data file in all)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    match = HUB_DATASET.match(value)
    if match is None:
        return None, Problem(param, "invalid_hub_dataset", "write a hub dataset as "
                             "hf://datasets/<owner>/<name>[@<revision>][/<file>]")
    repo, revision, file = match["repo"], match["rev"], match["file"]
    try:
        root = Path(snapshot_download(repo, repo_type="dataset", revision=revision,
                                      allow_patterns=[file] if file else DATA_PATTERNS,
                                      cache_dir=settings.hub_cache_dir, local_files_only=settings.hub_offline,
                                      etag_timeout=settings.hub_timeout_s))
    except RevisionNotFoundError:
        return None, Problem(param, "hub_revision_not_found", f"dataset {repo!r} has no revision {revision!r}")
    except RepositoryNotFoundError:
        return None, Problem(param, "hub_dataset_not_found", f"no dataset {repo!r} on the Hugging Face Hub "
                             "(or it is private or gated: set HF_TOKEN)")
    except LocalEntryNotFoundError:
        return None, Problem(param, "hub_unreachable", f"dataset {repo!r} is not in the Hugging Face cache "
                             "and the Hub cannot be reached (offline): download it once where there is "
                             "network, or upload the file")
    except (OSError, ValueError) as exc:
        return None, Problem(param, "hub_error", f"cannot fetch dataset {repo!r}: {exc}")
    if file:
        path = root / file
        if not path.is_file():
            return None, Problem(param, "file_not_found", f"dataset {repo!r} has no file {file!r}")
        return path, None
    files = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in (".jsonl", ".json", ".parquet", ".csv"))
    train = [p for p in files if "train" in p.name.lower()]
    chosen = train if train else files
    if len(chosen) != 1:
        listed = ", ".join(str(p.relative_to(root)) for p in files[:10]) or "none"
        return None, Problem(param, "hub_dataset_ambiguous",
                             f"dataset {repo!r} has {len(chosen)} candidate training files ({listed}): "
                             f"name one, as hf://datasets/{repo}/<file>")
    return chosen[0], None
