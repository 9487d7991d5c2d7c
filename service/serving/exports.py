"""Exports of a succeeded job's model: `merged` (the adapter folded into the base model's
weights, in the base model's dtype, as safetensors with its tokenizer and config: a model that
plain transformers loads and any server runs) or `adapter` (the published PEFT adapter as it is),
either one also pushed to a Hugging Face Hub repository with the operator's token (`HF_TOKEN`
in the service's environment or secrets file; never stored, never sent through Ray), only into
the namespaces the operator gave the job's tenant (`EFT_HUB_PUSH_NAMESPACES`), and never into an
existing repository that tenant's exports did not create. A tenant has at most
`EFT_EXPORTS_PER_TENANT` exports running, each reserving the memory its merge needs.

A merged export (and any push) runs as a Ray Job of its own (the API replica imports no torch):
    python -m eft.service.serving.exports --job-id ftjob-... --export-id <n> [--kind K] [--hub-repo R]
It loads the base model on the CPU, merges the adapter with PEFT's `merge_and_unload`, and
publishes the directory next to the job's artifact (`<artifact>.merged`) with the same atomic
publish as the artifact itself. Its progress is the job's events (`export_started`,
`exported`, `export_failed`), which `GET /jobs/{id}/exports` reads back.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from eft.service import credentials
from eft.types.jobs import JobStatus

log = logging.getLogger("eft.exports")

KINDS = ("merged", "adapter")
STARTED, DONE, FAILED = "export_started", "exported", "export_failed"
#: A Hub repository an export created (the tenant's to push to again).
HUB_CREATED = "export_hub_repo_created"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


class HubRepoNotOwned(Exception):
    """The repository exists and this tenant's exports did not create it."""


def _tenant_events(engine: Any, tenant: str, types: list[str]) -> list[Any]:
    import sqlalchemy as sa

    from eft.service.store.schema import job_events, jobs

    with engine.connect() as conn:
        return conn.execute(sa.select(job_events.c.job_id, job_events.c.type, job_events.c.data)
                            .join(jobs, jobs.c.id == job_events.c.job_id)
                            .where(jobs.c.tenant == tenant, job_events.c.type.in_(types))
                            .order_by(job_events.c.id)).all()


def open_exports(engine: Any, tenant: str) -> list[tuple[str, int, str | None]]:
    """The tenant's exports that have started and not said how they ended: (job id, export
    id, Ray submission id)."""
    found: dict[tuple[str, int], str | None] = {}
    for job_id, type_, data in _tenant_events(engine, tenant, [STARTED, DONE, FAILED]):
        key = (job_id, int((data or {}).get("export_id", -1)))
        if type_ == STARTED:
            found[key] = (data or {}).get("ray_submission_id")
        else:
            found.pop(key, None)
    return [(job_id, export_id, submission) for (job_id, export_id), submission in found.items()]


def repos_created(engine: Any, tenant: str) -> set[str]:
    """The Hub repositories the tenant's exports created."""
    return {(data or {}).get("hub_repo") for _, _, data in _tenant_events(engine, tenant, [HUB_CREATED])}


def memory_needed(model_path: str | None, kind: str) -> int:
    """Bytes an export's Ray Job reserves: a merge holds the base model's weights and writes
    them again (twice their size on disk, and 1 GiB besides); pushing an adapter, 512 MiB. A
    base whose weights are not on this node (a Hub id) counts as 8 GiB of weights."""
    if kind != "merged":
        return 512 * 2**20
    weights = 8 * 2**30
    if model_path and Path(model_path).is_dir():
        found = sum(f.stat().st_size for f in Path(model_path).iterdir()
                    if f.is_file() and f.suffix in WEIGHT_SUFFIXES)
        weights = found or weights
    return 2 * weights + 2**30


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
            "finished_at": None, "ray_submission_id": data.get("ray_submission_id"),
            "hub_repo": data.get("hub_repo"), "hub_url": None})
        if event["type"] == DONE:
            export.update(status="succeeded", path=data.get("path"), finished_at=event["created_at"],
                          bytes=data.get("bytes"), hub_url=data.get("hub_url"))
        elif event["type"] == FAILED:
            export.update(status="failed", error=event["message"], finished_at=event["created_at"])
    return sorted(found.values(), key=lambda e: e["id"])


def push_to_hub(folder: Path, repo: str, private: bool, endpoint: str | None, message: str,
                owned: Callable[[], bool] = lambda: False, created: Callable[[], None] = lambda: None) -> str:
    """Upload `folder` to the model repository `repo` with the operator's token: created (private
    unless told otherwise; `created()` records it) or, when it exists, only if `owned()` says the
    tenant's exports created it (else HubRepoNotOwned). Returns the commit's URL."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    api = HfApi(endpoint=endpoint or None, token=credentials.hub_token())
    try:
        api.create_repo(repo, repo_type="model", private=private, exist_ok=False)
        created()
    except HfHubHTTPError as exc:
        if getattr(exc.response, "status_code", None) != 409:
            raise
        if not owned():
            raise HubRepoNotOwned(f"the Hub repository {repo} exists and was not created by this tenant's exports: "
                                  "push to a new repository") from None
    return str(api.upload_folder(repo_id=repo, folder_path=str(folder), commit_message=message,
                                 ignore_patterns=["eft_commit.json"]).commit_url)


def write_merged(base: str, hub: dict[str, Any] | None, adapter: str, target: str, manifest: dict[str, Any],
                 push: Callable[[Path], str] | None = None) -> tuple[int, str | None]:
    """Merge the adapter at `adapter` (any storage) into the base model and publish the result
    at `target` (any storage), then hand the folder to `push` (the Hub) if given. Returns the
    bytes written and what `push` returned."""
    import torch
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from eft.service.serving.fetch import fetch
    from eft.training.model import hub_path
    from eft.training.artifacts import publish

    path = hub_path(hub) if hub else base
    work = Path(tempfile.mkdtemp(prefix="eft-export-"))
    try:
        adapter_dir, _ = fetch(adapter, work / "adapter-files", None)
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
        full_manifest = {**manifest, "kind": "merged", "dtype": str(dtype).removeprefix("torch.")}
        publish(out, target, full_manifest)
        if push is None:
            return written, None
        (out / "eft_manifest.json").write_text(json.dumps(full_manifest, indent=2, default=str))
        return written, push(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def push_adapter(adapter: str, push: Callable[[Path], str]) -> str:
    """Push the published adapter at `adapter` (any storage) with `push`."""
    from eft.service.serving.fetch import fetch

    work = Path(tempfile.mkdtemp(prefix="eft-export-"))
    try:
        directory, _ = fetch(adapter, work, None)
        return push(directory)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(job_id: str, export_id: int, kind: str = "merged", hub_repo: str | None = None,
        hub_private: bool = True) -> int:
    """The Ray Job of one export: reads the job, merges (kind "merged") and pushes to the Hub
    (with `hub_repo`), and records the outcome."""
    from eft.service import jsonlog
    from eft.service.settings import get_settings
    from eft.service.store.store import Store

    jsonlog.configure()
    credentials.load()
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    try:
        job = store.get_job(job_id)
        config = job.config or {}
        assert job.status is JobStatus.succeeded and job.artifact_path
        data: dict[str, Any] = {"export_id": export_id, "kind": kind, "hub_repo": hub_repo}
        push = None
        if hub_repo:
            def push(folder: Path) -> str:
                return push_to_hub(
                    folder, hub_repo, hub_private, settings.hub_endpoint, f"{kind} model of fine-tuning job {job.id}",
                    owned=lambda: hub_repo in repos_created(store.engine, job.tenant),
                    created=lambda: store.append_event(job.id, HUB_CREATED, f"Hub repository {hub_repo} created",
                                                       data={"hub_repo": hub_repo, "export_id": export_id}))
        try:
            if kind == "merged":
                target = destination(job.artifact_path, "merged")
                written, hub_url = write_merged(
                    config.get("model_path") or job.request["model"], config.get("hub"), job.artifact_path, target,
                    {"job_id": job.id, "base_model": job.request["model"], "adapter": job.artifact_path}, push)
                data.update(path=target, bytes=written)
            else:
                assert push is not None
                hub_url = push_adapter(job.artifact_path, push)
                data.update(path=job.artifact_path)
        except Exception as exc:  # noqa: BLE001 - recorded on the job for its owner to read
            log.exception("export %s of %s failed", export_id, job_id)
            reason = str(exc) if isinstance(exc, HubRepoNotOwned) else f"{type(exc).__name__}: {exc}"
            store.append_event(job_id, FAILED, f"{kind} export failed: {reason}", data=data, level="error")
            return 1
        if hub_url:
            data["hub_url"] = hub_url
        where = f"pushed to {hub_repo}" if hub_repo else f"written to {data['path']}"
        store.append_event(job_id, DONE, f"{kind} model {where}", data=data)
        return 0
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export a succeeded job's model (merge, push to the Hub).")
    parser.add_argument("--job-id", required=True)
    parser.add_argument("--export-id", type=int, required=True)
    parser.add_argument("--kind", choices=KINDS, default="merged")
    parser.add_argument("--hub-repo")
    parser.add_argument("--hub-public", action="store_true")
    args = parser.parse_args(argv)
    return run(args.job_id, args.export_id, args.kind, args.hub_repo, not args.hub_public)


if __name__ == "__main__":
    sys.exit(main())
