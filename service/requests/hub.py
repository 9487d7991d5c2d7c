"""Hugging Face hub ids as base models: resolved on the request path to a pinned revision.

The service downloads only what it reads (config, tokenizer, chat template) into the Hugging
Face cache and plans and tokenises from that snapshot; the job then carries the repository id
and the commit it resolved to, and every worker loads exactly that revision through the same
cache (one download per node, or one in all on a shared cache directory). Without network, or
with `hub_offline`, only what the cache holds resolves; anything else is a 422 at once.

Tenants do not borrow the operator's Hugging Face token: a Hub id is fetched anonymously (by the
service and the workers alike) unless the operator lets the tenant read that repository or
organisation with it (`EFT_HUB_READ_REPOS`). What the service downloads for a request is
sized from the Hub's listing first (`EFT_HUB_MAX_SERVICE_BYTES` for a model's files,
`EFT_MAX_DATASET_BYTES` for a dataset's) and fetched in a helper process under its time limit.
"""

from __future__ import annotations

import contextvars
import re
from pathlib import Path
from typing import Any

from eft.service.errors import Problem
from eft.service.settings import Settings

#: What the service reads of a hub model; the weights are the workers' to fetch.
SERVICE_FILES = ["*.json", "*.jinja", "tokenizer*", "*.model", "*.tiktoken", "merges.txt", "vocab.*"]


#: The operator's token as the replica has it, handed to a helper process with the work (a helper
#: spawned before the replica loaded its secrets would not find it in its own environment).
operator_token: contextvars.ContextVar[str | None] = contextvars.ContextVar("eft_hub_operator_token", default=None)


def read_token(repo_id: str, settings: Settings) -> str | bool:
    """The operator's token where the tenant of this request may read `repo_id` with it
    (`EFT_HUB_READ_REPOS`: the repository, or its organisation as `org/*`); else False, which
    huggingface_hub takes as: send no token."""
    from eft.service import isolation
    from eft.service.credentials import hub_token

    tenant = isolation.tenant.get()
    patterns = settings.hub_read_repos.get(tenant, []) if tenant else []
    if any(repo_id == p or (p.endswith("/*") and repo_id.startswith(p[:-1])) for p in patterns):
        return operator_token.get() or hub_token() or False
    return False


def _listed_bytes(repo_id: str, repo_type: str, revision: str | None, patterns: list[str], token: str | bool,
                  endpoint: str | None, timeout: float) -> int:
    """What the files of `repo_id` that match `patterns` weigh, from the Hub's listing."""
    from huggingface_hub import HfApi
    from huggingface_hub.utils import filter_repo_objects

    info = HfApi(endpoint=endpoint, token=token).repo_info(repo_id, repo_type=repo_type, revision=revision,
                                                          files_metadata=True, timeout=timeout)
    chosen = filter_repo_objects(info.siblings or [], allow_patterns=patterns, key=lambda f: f.rfilename)
    return sum(f.size or 0 for f in chosen)


def snapshot(repo_id: str, settings: Settings, revision: str | None = None) -> tuple[Path | None, Problem | None]:
    """The local snapshot directory of `repo_id` at `revision` (default: the main branch's
    current commit), or the problem naming why it cannot be had: fetched in a helper process
    (service/isolation.py), with the operator's token only where the tenant may use it."""
    from eft.service import isolation
    return isolation.run(_snapshot, repo_id, revision, read_token(repo_id, settings), settings.hub_endpoint,
                         settings.hub_cache_dir, settings.hub_offline, settings.hub_timeout_s,
                         settings.hub_max_service_bytes, param="model")


def _snapshot(repo_id: str, revision: str | None, token: str | bool, endpoint: str | None, cache_dir: Path | None,
              offline: bool, timeout: float, most_bytes: int) -> tuple[Path | None, Problem | None]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        if not offline:
            size = _listed_bytes(repo_id, "model", revision, SERVICE_FILES, token, endpoint, timeout)
            if size > most_bytes:
                return None, Problem("model", "hub_files_too_large",
                                     f"{repo_id!r} has {size:,} bytes of config, tokenizer and template files, more "
                                     f"than the {most_bytes:,} this server reads for a request "
                                     "(EFT_HUB_MAX_SERVICE_BYTES)")
        path = snapshot_download(
            repo_id, revision=revision, allow_patterns=SERVICE_FILES, cache_dir=cache_dir,
            local_files_only=offline, etag_timeout=timeout, token=token, endpoint=endpoint,
        )
    except GatedRepoError:
        return None, Problem("model", "hub_model_gated",
                             f"{repo_id!r} is gated on the Hugging Face Hub: the operator lets a tenant read it "
                             "with the service's token (EFT_HUB_READ_REPOS) once the license is accepted")
    except RevisionNotFoundError:
        return None, Problem("model", "hub_revision_not_found", f"{repo_id!r} has no revision {revision!r}")
    except RepositoryNotFoundError:
        return None, Problem("model", "hub_model_not_found",
                             f"no model {repo_id!r} on the Hugging Face Hub that this tenant may read (a private "
                             "one is read with the service's token only where the operator allows it: "
                             "EFT_HUB_READ_REPOS)")
    except LocalEntryNotFoundError:
        where = cache_dir or "the Hugging Face cache"
        return None, Problem("model", "hub_unreachable",
                             f"{repo_id!r} is not in {where} and the Hub cannot be reached from the "
                             "service (offline): download it once where there is network (for example "
                             "`huggingface-cli download` into that cache), or name a local model directory")
    except (OSError, ValueError) as exc:
        return None, Problem("model", "hub_error", f"cannot fetch {repo_id!r} from the Hub: {exc}")
    return Path(path), None


def hub_source(model_path: str, settings: Settings) -> dict[str, Any] | None:
    """For a snapshot directory of the Hugging Face cache (`.../models--org--name/snapshots/
    <commit>`), how workers load it: repository id, pinned revision, the cache, and whether
    with their node's token (`use_token`: only where this tenant may read it with it); else None."""
    path = Path(model_path)
    repo = path.parent.parent
    if path.parent.name != "snapshots" or not repo.name.startswith("models--"):
        return None
    repo_id = repo.name[len("models--"):].replace("--", "/")
    return {"repo_id": repo_id, "revision": path.name, "cache_dir": str(repo.parent),
            "local_files_only": settings.hub_offline, "use_token": bool(read_token(repo_id, settings)),
            "endpoint": settings.hub_endpoint}


#: `hf://datasets/<owner>/<name>[@<revision>][/<path in the repository>]`
HUB_DATASET = re.compile(r"^hf://datasets/(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<rev>[\w./-]+?))?(?:/(?P<file>.+))?$")
DATA_PATTERNS = ["*.jsonl", "*.json", "*.parquet", "*.csv", "**/*.jsonl", "**/*.json", "**/*.parquet", "**/*.csv"]


def dataset_file(value: str, param: str, settings: Settings) -> tuple[Path | None, Problem | None]:
    """The local file a hub dataset reference names, fetched into the Hugging Face cache at a
    pinned commit (the path holds it) in a helper process, with the operator's token only where
    the tenant may use it. Without a file part the repository must hold exactly one data file
    with "train" in its name (or one data file in all)."""
    from eft.service import isolation
    match = HUB_DATASET.match(value)
    if match is None:
        return None, Problem(param, "invalid_hub_dataset", "write a hub dataset as "
                             "hf://datasets/<owner>/<name>[@<revision>][/<file>]")
    return isolation.run(_dataset_file, match["repo"], match["rev"], match["file"], param,
                         read_token(match["repo"], settings), settings.hub_endpoint, settings.hub_cache_dir,
                         settings.hub_offline, settings.hub_timeout_s, settings.max_dataset_bytes, param=param)


def _dataset_file(repo: str, revision: str | None, file: str | None, param: str, token: str | bool,
                  endpoint: str | None, cache_dir: Path | None, offline: bool, timeout: float,
                  most_bytes: int) -> tuple[Path | None, Problem | None]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    patterns = [file] if file else DATA_PATTERNS
    try:
        if not offline:
            size = _listed_bytes(repo, "dataset", revision, patterns, token, endpoint, timeout)
            if size > most_bytes:
                return None, Problem(param, "file_too_large", f"dataset {repo!r} has {size:,} bytes of data files, "
                                     f"more than {most_bytes:,} (EFT_MAX_DATASET_BYTES): name one file, as "
                                     f"hf://datasets/{repo}/<file>")
        root = Path(snapshot_download(repo, repo_type="dataset", revision=revision, allow_patterns=patterns,
                                      cache_dir=cache_dir, local_files_only=offline, etag_timeout=timeout,
                                      token=token, endpoint=endpoint))
    except RevisionNotFoundError:
        return None, Problem(param, "hub_revision_not_found", f"dataset {repo!r} has no revision {revision!r}")
    except RepositoryNotFoundError:
        return None, Problem(param, "hub_dataset_not_found", f"no dataset {repo!r} on the Hugging Face Hub that "
                             "this tenant may read (a private or gated one is read with the service's token only "
                             "where the operator allows it: EFT_HUB_READ_REPOS)")
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
