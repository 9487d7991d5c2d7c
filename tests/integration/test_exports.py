"""Exports of a succeeded job's model over the real app and store: a merged model that plain
transformers loads with the same logits as base + adapter (fp32, atol 1e-4), downloaded through
the API and checked; the adapter export; 409 naming the status of a job that did not succeed.
The merge runs in-process here, as the Ray Job the launcher submits would run it (the Ray path
is in tests/e2e/test_openai_compat.py)."""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient

from eft.api.app import create_app
from eft.service import exports
from eft.service.auth import KeyStore
from eft.service.jobs import JobService
from eft.service.launcher import RayJobsLauncher
from eft.service.settings import BUNDLED_ASSETS, get_settings
from eft.service.store import Store
from eft.types.jobs import JobStatus

pytestmark = pytest.mark.integration
BASE = BUNDLED_ASSETS / "models" / "tiny-qwen3"


class InProcessExports(RayJobsLauncher):
    """Runs the export's Ray Job entrypoint in this process instead of submitting it."""

    def submit_export(self, job_id: str, export_id: int) -> str:
        self.pending = (job_id, export_id)
        return f"{job_id}-export-{export_id}"

    def state(self, submission_id: str) -> str:
        return "RUNNING"


@pytest.fixture
def env(eft_home, tmp_path):
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    launcher = InProcessExports(settings)
    app = create_app(JobService(store, launcher, settings))
    _, key = KeyStore(store.engine).create("acme", "user", name="t")
    turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    (eft_home / "data" / "chat.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as client:
        yield client, store, launcher, tmp_path
    store.close()


def _adapter(where):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(BASE),
                           LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
    model.save_pretrained(where)
    AutoTokenizer.from_pretrained(BASE).save_pretrained(where)
    return where


def test_a_merged_export_loads_with_plain_transformers_and_gives_base_plus_adapter_logits(env, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from eft import Client

    client, store, launcher, _ = env
    job = client.post("/jobs", json={"model": "tiny-qwen3", "training_file": "chat.jsonl"}).json()
    early = client.post(f"/jobs/{job['id']}/export", json={"kind": "merged"})
    assert early.status_code == 409 and early.json()["error"]["code"] == "job_not_succeeded"
    assert "validating" in early.json()["error"]["message"]
    assert client.get(f"/jobs/{job['id']}/exports").json()["data"] == []

    artifact = _adapter(tmp_path / "artifact")
    store.transition(job["id"], JobStatus.queued, "validated", config={"model_path": str(BASE), "method": "lora"})
    store.transition(job["id"], JobStatus.running, "dispatched", attempt=1)
    store.transition(job["id"], JobStatus.succeeded, "done", artifact_path=str(artifact))

    started = client.post(f"/jobs/{job['id']}/export")
    assert started.status_code == 202 and started.json()["status"] == "running" and started.json()["id"] == 1
    assert started.json()["path"] == f"{artifact}.merged"
    again = client.post(f"/jobs/{job['id']}/export", json={"kind": "merged"})
    assert again.status_code == 202 and again.json()["id"] == 1  # the running one, not a second
    pending = client.get(f"/jobs/{job['id']}/artifacts", params={"export": "merged"})
    assert pending.status_code == 409 and pending.json()["error"]["code"] == "export_not_available"

    assert exports.run(*launcher.pending) == 0  # what the Ray Job runs
    listed = client.get(f"/jobs/{job['id']}/exports").json()["data"]
    assert [(e["id"], e["kind"], e["status"]) for e in listed] == [(0, "adapter", "succeeded"), (1, "merged", "succeeded")]
    assert client.post(f"/jobs/{job['id']}/export").status_code == 200

    key = client.headers["Authorization"].removeprefix("Bearer ")
    with Client(base_url="http://testserver", api_key=key, max_retries=0, http_client=client) as ours:
        paths = ours.jobs.download(job["id"], tmp_path / "merged", merged=True)
    names = {p.name for p in paths}
    assert {"config.json", "model.safetensors", "tokenizer.json", "eft_manifest.json"} <= names
    assert not any("adapter" in n for n in names)

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    assert type(merged).__name__ == "Qwen3ForCausalLM" and merged.dtype == torch.float32
    reference = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(BASE), str(artifact))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "merged")
    ids = tokenizer("The merged model answers as base plus adapter did.", return_tensors="pt")["input_ids"]
    with torch.no_grad():
        got, want = merged(ids).logits, reference(ids).logits
        base = AutoModelForCausalLM.from_pretrained(BASE)(ids).logits
    assert torch.allclose(got, want, atol=1e-4, rtol=0)
    assert not torch.allclose(got, base, atol=1e-2)  # the adapter changed something
    manifest = json.loads((tmp_path / "merged" / "eft_manifest.json").read_text())
    assert manifest["kind"] == "merged" and manifest["job_id"] == job["id"] and manifest["dtype"] == "float32"
