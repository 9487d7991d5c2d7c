"""The job's artifact: a PEFT adapter directory plus `eft_manifest.json`, published atomically.

The adapter comes from the final checkpoint's `adapter/` folder. On local disk it is copied into
a hidden temporary folder beside its destination and one rename makes it visible; on an object
store it is staged under a temporary prefix, copied into place, and `eft_commit.json` written
last. Either way a reader that requires the marker never sees half an artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import uuid
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from eft.training import storage
from eft.training.config import TrainConfig
from eft.training.formats import content_digest

MANIFEST = "eft_manifest.json"
# Written last: an artifact without it is incomplete (a publish still running, or cut short).
COMMIT_MARKER = "eft_commit.json"
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
    if path.is_dir():  # a `datasets` directory
        return content_digest(path)
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def model_fingerprint(model_dir: Path) -> str:
    """A hash identifying a base model without reading all its weights: config, tokenizer and
    every weight file's name, size and safetensors header (which lists every tensor's shape,
    dtype and byte range)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.iterdir() if p.is_file()):
        digest.update(path.name.encode())
        digest.update(str(path.stat().st_size).encode())
        if path.suffix == ".safetensors":
            with open(path, "rb") as fh:
                (header_len,) = struct.unpack("<Q", fh.read(8))
                digest.update(fh.read(header_len))
        elif path.suffix in (".json", ".txt", ".model", ".jinja"):
            digest.update(path.read_bytes())
    return digest.hexdigest()


def _versions() -> dict[str, str]:
    out = {}
    for pkg in ("eft", "torch", "transformers", "peft", "ray", "deepspeed"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out


def build_manifest(cfg: TrainConfig, metrics: dict[str, Any], attempt: int) -> dict[str, Any]:
    model_dir = Path(cfg.model_path)
    datasets = {"training_file": {"path": cfg.training_file, "sha256": file_sha256(Path(cfg.training_file))}}
    if cfg.validation_file:
        datasets["validation_file"] = {
            "path": cfg.validation_file, "sha256": file_sha256(Path(cfg.validation_file))
        }
    return {
        "format": "eft.manifest/v1",
        "job_id": cfg.job_id,
        "attempt": attempt,
        "created_at": datetime.now(timezone.utc).isoformat(),
        "base_model": {
            "name": cfg.base_model_name,
            "path": str(model_dir),
            "fingerprint_sha256": model_fingerprint(model_dir) if model_dir.is_dir() else None,
            # A hub model: the repository and the commit every worker loaded.
            "hub": None if not cfg.hub else {"repo_id": cfg.hub["repo_id"], "revision": cfg.hub["revision"]},
        },
        "datasets": datasets,
        "method": cfg.method,
        "lora": None if cfg.lora is None else {
            "r": cfg.lora.r, "alpha": cfg.lora.alpha, "dropout": cfg.lora.dropout,
            "target_modules": cfg.lora.target_modules, "module_scope": cfg.lora.module_scope,
            "quant_type": cfg.lora.quant_type,
        },
        "hyperparameters": {
            k: getattr(cfg, k) for k in (
                "total_steps", "learning_rate", "lr_scheduler", "warmup_steps", "weight_decay",
                "max_grad_norm", "global_batch_size", "micro_batch_size", "max_seq_len", "seed",
            )
        },
        "strategy": cfg.strategy,
        "optimizations": {
            "offload": cfg.offload, "gradient_checkpointing": cfg.gradient_checkpointing,
            "attention": cfg.attention, "precision": cfg.precision,
        },
        "memory_gb": {
            "predicted_per_worker": cfg.predicted_memory_gb,
            "measured_peak_per_worker": [
                metrics[f"peak_memory_gb_rank{r}"] for r in range(int(metrics.get("world_size", 0)))
                if f"peak_memory_gb_rank{r}" in metrics
            ],
        },
        "final_metrics": metrics,
        # A continued job: the checkpoint it started from (its own lineage is in that job's manifest).
        "lineage": None if not cfg.init_job else {
            "continued_from_job": cfg.init_job, "step": cfg.init_step, "checkpoint": cfg.init_from,
            "optimizer_state": cfg.init_optimizer},
        "versions": _versions(),
    }


def destination(artifact_root: str, job_id: str, attempt: int) -> str:
    """Where an attempt of a job publishes its artifact: `<root>/<job id>/attempt-<n>`."""
    return f"{artifact_root.rstrip('/')}/{job_id}/attempt-{attempt}"


def publish(adapter_dir: Path, destination: str | Path, manifest: dict[str, Any]) -> str:
    """Copy `adapter_dir` to `destination` (a path or object-store URI) with the manifest,
    atomically. Returns the destination as a path or URI.

    An existing destination (a previous attempt's artifact) is replaced as a whole. Locally the
    artifact is staged beside its destination and renamed into place; an object store has no
    rename, so the files are staged under a temporary prefix, copied into place, and only then
    is the commit marker written: readers (`download`, `is_committed`) require it.
    """
    location = storage.resolve(destination)
    if not location.remote:
        return _publish_local(adapter_dir, Path(location.path), manifest)
    fs = location.filesystem
    parent, name = location.path.rsplit("/", 1)
    staging = f"{parent}/.staging/{name}-{uuid.uuid4().hex[:12]}"
    pafs.copy_files(str(adapter_dir), staging, source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)
    manifest_text = json.dumps(manifest, indent=2, default=str)
    storage.write_text(fs, f"{staging}/{MANIFEST}", manifest_text)
    files = _listing(fs, staging)
    hashes = _hashes(adapter_dir, manifest_text)
    # Withdraw the previous artifact's marker first, so no reader trusts a mix of the two.
    if _exists(fs, f"{location.path}/{COMMIT_MARKER}"):
        fs.delete_file(f"{location.path}/{COMMIT_MARKER}")
    fs.delete_dir_contents(location.path, missing_dir_ok=True)
    for relative in files:
        fs.copy_file(f"{staging}/{relative}", f"{location.path}/{relative}")
    storage.write_text(fs, f"{location.path}/{COMMIT_MARKER}", json.dumps({"files": files, "sha256": hashes}))
    fs.delete_dir(staging)
    return location.uri


def _publish_local(adapter_dir: Path, destination: Path, manifest: dict[str, Any]) -> str:
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = destination.parent / f".{destination.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(adapter_dir, staging)
    manifest_text = json.dumps(manifest, indent=2, default=str)
    (staging / MANIFEST).write_text(manifest_text)
    fs = pafs.LocalFileSystem()
    (staging / COMMIT_MARKER).write_text(json.dumps({"files": _listing(fs, str(staging)),
                                                     "sha256": _hashes(adapter_dir, manifest_text)}))
    if destination.exists():
        retired = destination.parent / f".{destination.name}.old-{os.getpid()}"
        os.replace(destination, retired)
        shutil.rmtree(retired, ignore_errors=True)
    os.replace(staging, destination)
    return str(destination)


def _hashes(directory: Path, manifest_text: str) -> dict[str, str]:
    """{relative path: SHA-256} of the files published from `directory` and of the manifest:
    computed once here and kept in the commit marker, so that listing an artifact for download
    reads them instead of reading every byte again."""
    found = {p.relative_to(directory).as_posix(): file_sha256(p) for p in sorted(directory.rglob("*"))
             if p.is_file() and p.name not in (MANIFEST, COMMIT_MARKER)}
    found[MANIFEST] = hashlib.sha256(manifest_text.encode()).hexdigest()
    return found


def _exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type == pafs.FileType.File


def _listing(fs: pafs.FileSystem, root: str) -> dict[str, int]:
    """{relative path: size} of every file under `root`."""
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    return {i.path[len(root.rstrip("/")) + 1:]: i.size for i in infos if i.type == pafs.FileType.File}


def is_committed(artifact: str | Path) -> bool:
    """Whether a complete artifact is published at `artifact` (its commit marker is there)."""
    location = storage.resolve(artifact)
    return _exists(location.filesystem, f"{location.path}/{COMMIT_MARKER}")


def download(artifact: str | Path, local_dir: Path) -> Path:
    """Copy a published artifact (path or URI) into `local_dir`, e.g. for
    `PeftModel.from_pretrained(base, local_dir)`. Returns `local_dir`.

    Raises FileNotFoundError if the artifact is not committed (missing, or still being written).
    """
    location = storage.resolve(artifact)
    marker = storage.read_text(location.filesystem, f"{location.path}/{COMMIT_MARKER}")
    if marker is None:
        raise FileNotFoundError(f"no committed artifact at {artifact}: publish has not finished")
    local_dir.mkdir(parents=True, exist_ok=True)
    for relative in json.loads(marker)["files"]:
        (local_dir / relative).parent.mkdir(parents=True, exist_ok=True)
        pafs.copy_files(f"{location.path}/{relative}", str(local_dir / relative),
                        source_filesystem=location.filesystem,
                        destination_filesystem=pafs.LocalFileSystem())
    return local_dir
