"""Exports of a succeeded job's model: `merged` (the adapter folded into the base model's
weights, in the base model's dtype, as safetensors with its tokenizer and config: a model that
plain transformers loads and any server runs) or `adapter` (the published PEFT adapter as it is).

A merged export runs as a Ray Job of its own (the service's API replica imports no torch):
    python -m eft.service.exports --job-id ftjob-... --export-id <n>
It loads the base model on the CPU, merges the adapter with PEFT's `merge_and_unload`, and
publishes the directory next to the job's artifact (`<artifact>.merged`) with the same atomic
publish as the artifact itself. Its progress is the job's events (`export_started`,
`exported`, `export_failed`), which `GET /jobs/{id}/exports` reads back.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from eft.types.jobs import JobStatus

log = logging.getLogger("eft.exports")

KINDS = ("merged", "adapter")
STARTED, DONE, FAILED = "export_started", "exported", "export_failed"


def destination(artifact_path: str, kind: str) -> str:
    """Where a merged export of the artifact at `artifact_path` is published."""
    return f"{artifact_path.rstrip('/')}.{kind}"


def exports_from_events(job_id: str, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each export the job's events tell of, oldest first: id, kind, status (running,
    succeeded, failed), path, error, created_at, finished_at."""
    found: dict[int, dict[str, Any]] = {}
    for event in events:
        data = event.get("data") or {}
        if event["type"] not in (STARTED, DONE, FAILED) or "export_id" not in data:
            continue
        export = found.setdefault(int(data["export_id"]), {
            "object": "export", "id": int(data["export_id"]), "job_id": job_id, "kind": data.get("kind", "merged"),
            "status": "running", "path": data.get("path"), "error": None, "created_at": event["created_at"],
            "finished_at": None, "ray_submission_id": data.get("ray_submission_id")})
        if event["type"] == DONE:
            export.update(status="succeeded", path=data.get("path"), finished_at=event["created_at"],
                          bytes=data.get("bytes"))
        elif event["type"] == FAILED:
            export.update(status="failed", error=event["message"], finished_at=event["created_at"])
    return sorted(found.values(), key=lambda e: e["id"])


def write_merged(base: str, hub: dict[str, Any] | None, adapter: str, target: str, manifest: dict[str, Any]) -> int:
    """Merge the adapter at `adapter` (any storage) into the base model and publish the result
    at `target` (any storage). Returns the bytes written."""
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from eft.service.inference import _fetch, _hub_path
    from eft.training.artifacts import publish

    path = _hub_path(hub) if hub else base
    work = Path(tempfile.mkdtemp(prefix="eft-export-"))
    try:
        adapter_dir, _ = _fetch(adapter, work / "adapter-files", None)
        config = AutoConfig.from_pretrained(path)
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        merged = PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
        out = work / "merged"
        merged.save_pretrained(out, safe_serialization=True)
        tokenizer_source = adapter_dir if (adapter_dir / "tokenizer_config.json").is_file() else Path(path)
        AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(out)
        written = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
        publish(out, target, {**manifest, "kind": "merged", "dtype": str(dtype).removeprefix("torch.")})
        return written
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(job_id: str, export_id: int) -> int:
    """The Ray Job of one merged export: reads the job, merges, records the outcome."""
    from eft.service import credentials, jsonlog
    from eft.service.settings import get_settings
    from eft.service.store import Store

    jsonlog.configure()
    credentials.load()
    store = Store(get_settings().resolved_database_url)
    try:
        job = store.get_job(job_id)
        config = job.config or {}
        assert job.status is JobStatus.succeeded and job.artifact_path
        target = destination(job.artifact_path, "merged")
        data = {"export_id": export_id, "kind": "merged"}
        try:
            written = write_merged(config.get("model_path") or job.request["model"], config.get("hub"),
                                   job.artifact_path, target,
                                   {"job_id": job.id, "base_model": job.request["model"], "adapter": job.artifact_path})
        except Exception as exc:  # noqa: BLE001 - recorded on the job for its owner to read
            log.exception("export %s of %s failed", export_id, job_id)
            store.append_event(job_id, FAILED, f"merged export failed: {type(exc).__name__}: {exc}", data=data,
                               level="error")
            return 1
        store.append_event(job_id, DONE, f"merged model written to {target}",
                           data={**data, "path": target, "bytes": written})
        return 0
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a merged export of a succeeded job's model.")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--export-id", type=int, required=True)
    args = parser.parse_args(argv)
    return run(args.job_id, args.export_id)


if __name__ == "__main__":
    sys.exit(main())
