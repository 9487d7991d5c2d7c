"""The job's artifact: a PEFT adapter directory plus `eft_manifest.json`, published atomically.

The adapter comes from the final checkpoint's `adapter/` folder; it is copied into a hidden
temporary folder beside its destination, the manifest is written, and one rename makes it
visible, so a reader never sees half an artifact.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from training.config import TrainConfig

MANIFEST = "eft_manifest.json"
_CHUNK = 1 << 20


def file_sha256(path: Path) -> str:
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
        },
        "datasets": datasets,
        "method": cfg.method,
        "lora": None if cfg.lora is None else {
            "r": cfg.lora.r, "alpha": cfg.lora.alpha, "dropout": cfg.lora.dropout,
            "target_modules": cfg.lora.target_modules, "quant_type": cfg.lora.quant_type,
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
        "versions": _versions(),
    }


def publish(adapter_dir: Path, destination: Path, manifest: dict[str, Any]) -> Path:
    """Copy `adapter_dir` to `destination` with the manifest, atomically. Returns destination.

    An existing destination (a previous attempt's artifact) is replaced as a whole.
    """
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = destination.parent / f".{destination.name}.staging-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(adapter_dir, staging)
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str))
    if destination.exists():
        retired = destination.parent / f".{destination.name}.old-{os.getpid()}"
        os.replace(destination, retired)
        shutil.rmtree(retired, ignore_errors=True)
    os.replace(staging, destination)
    return destination
