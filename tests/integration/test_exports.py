"""Exports of a succeeded job's model over the real app and store: a merged model that plain
transformers loads with the same logits as base + adapter (fp32, atol 1e-4), downloaded through
the API and checked; the adapter export; 409 naming the status of a job that did not succeed.
The merge runs in-process here, as the Ray Job the launcher submits would run it (the Ray path
is in tests/e2e/test_openai_job.py). Pushes go to a Hub on loopback that speaks the parts of
the Hub's HTTP API `huggingface_hub` uses for a commit of regular files (create repo, preupload,
commit), through the real `huggingface_hub` client."""

from __future__ import annotations

import base64
import http.server
import json
import threading

import pytest
import torch
from fastapi.testclient import TestClient

from eft.service.serving import exports
from eft.service.accounts.auth import KeyStore
from eft.service.runs.launcher import RayJobsLauncher
from eft.service.settings import BUNDLED_ASSETS, get_settings
from eft.service.store.store import Store
from eft.types.jobs import JobStatus
from tests.helpers.app import service_app

BASE = BUNDLED_ASSETS / "models" / "tiny-qwen3"


class InProcessExports(RayJobsLauncher):
    """Runs the export's Ray Job entrypoint in this process instead of submitting it."""

    def submit_export(self, job_id: str, export_id: int, kind: str = "merged", hub_repo: str | None = None,
                      hub_private: bool = True, memory: int | None = None) -> str:
        self.pending = (job_id, export_id, kind, hub_repo, hub_private)
        self.memory = memory
        return f"{job_id}-export-{export_id}"

    def state(self, submission_id: str) -> str:
        return "RUNNING"


@pytest.fixture
def env(eft_home, tmp_path):
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    launcher = InProcessExports(settings)
    app = service_app(store, settings, launcher=launcher)
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


class _Hub(http.server.BaseHTTPRequestHandler):
    """The Hub's repo-create, preupload and commit endpoints, keeping what was committed."""

    token, repos, commits = "hf_test_token", {}, {}

    def _answer(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            return self._answer(401, {"error": "Invalid credentials"})
        base = f"http://{self.headers['Host']}"
        if self.path == "/api/validate-yaml":  # the model card's metadata (PEFT writes a README.md)
            return self._answer(200, {"errors": [], "warnings": []})
        if self.path == "/api/repos/create":
            request = json.loads(body)
            repo = f"{request['organization']}/{request['name']}" if request.get("organization") else request["name"]
            if repo in self.repos:
                return self._answer(409, {"error": "You already created this model repo", "url": f"{base}/{repo}"})
            self.repos[repo] = request
            return self._answer(200, {"url": f"{base}/{repo}"})
        parts = self.path.split("?")[0].split("/")  # /api/models/<org>/<name>/<verb>/<revision>
        repo, verb = f"{parts[3]}/{parts[4]}", parts[5]
        if verb == "preupload":
            files = json.loads(body)["files"]
            return self._answer(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                for f in files]})
        if verb == "commit":
            lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
            files = {v["value"]["path"]: base64.b64decode(v["value"]["content"]) for v in lines if v["key"] == "file"}
            self.commits.setdefault(repo, []).append(files)
            return self._answer(200, {"commitUrl": f"{base}/{repo}/commit/abc123", "commitOid": "abc123"})
        return self._answer(404, {"error": f"not emulated: {self.path}"})

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture
def hub(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Hub.repos, _Hub.commits = {}, {}
    monkeypatch.setenv("EFT_HUB_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    get_settings.cache_clear()
    yield _Hub
    server.shutdown()


def test_exports_push_to_the_hub_with_the_operators_token_only(env, hub, tmp_path, monkeypatch):
    client, store, launcher, _ = env
    job = client.post("/jobs", json={"model": "tiny-qwen3", "training_file": "chat.jsonl"}).json()
    artifact = _adapter(tmp_path / "artifact")
    store.transition(job["id"], JobStatus.queued, "validated", config={"model_path": str(BASE), "method": "lora"})
    store.transition(job["id"], JobStatus.running, "dispatched", attempt=1)
    store.transition(job["id"], JobStatus.succeeded, "done", artifact_path=str(artifact))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    refused = client.post(f"/jobs/{job['id']}/export", json={"kind": "adapter", "hub_repo": "acme/bot"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "hub_token_missing"
    bad = client.post(f"/jobs/{job['id']}/export", json={"hub_repo": "no slash"})
    assert bad.status_code == 422 and bad.json()["error"]["param"] == "hub_repo"

    monkeypatch.setenv("HF_TOKEN", hub.token)
    monkeypatch.setenv("EFT_HUB_PUSH_NAMESPACES", '{"acme": ["acme"]}')
    get_settings.cache_clear()
    client.app.state.job_service.exports.settings = get_settings()
    for kind, repo in (("adapter", "acme/bot-adapter"), ("merged", "acme/bot")):
        started = client.post(f"/jobs/{job['id']}/export", json={"kind": kind, "hub_repo": repo})
        assert started.status_code == 202 and started.json()["hub_repo"] == repo
        assert exports.run(*launcher.pending) == 0  # what the Ray Job runs
        done = [e for e in client.get(f"/jobs/{job['id']}/exports").json()["data"] if e["hub_repo"] == repo]
        assert done[0]["status"] == "succeeded" and done[0]["hub_url"].endswith(f"/{repo}/commit/abc123")
        assert hub.repos[repo]["visibility"] == "private"
    pushed = hub.commits["acme/bot-adapter"][0]
    assert pushed["adapter_model.safetensors"] == (artifact / "adapter_model.safetensors").read_bytes()
    merged = hub.commits["acme/bot"][0]
    assert {"config.json", "model.safetensors", "tokenizer.json", "eft_manifest.json"} <= set(merged)
    assert json.loads(merged["eft_manifest.json"])["job_id"] == job["id"]
    # The token never reached the job's record.
    events = client.get(f"/jobs/{job['id']}/events", params={"limit": 1000}).text
    assert hub.token not in events


def _succeeded_job(client, store, tmp_path):
    job = client.post("/jobs", json={"model": "tiny-qwen3", "training_file": "chat.jsonl"}).json()
    artifact = _adapter(tmp_path / f"artifact-{job['id']}")
    store.transition(job["id"], JobStatus.queued, "validated", config={"model_path": str(BASE), "method": "lora"})
    store.transition(job["id"], JobStatus.running, "dispatched", attempt=1)
    store.transition(job["id"], JobStatus.succeeded, "done", artifact_path=str(artifact))
    return job["id"]


def test_pushes_go_only_to_the_tenants_namespaces_and_repositories(env, hub, tmp_path, monkeypatch):
    """Before: any `owner/name` was created or pushed into with the operator's token (one tenant
    overwrote another's model, or made repositories in the operator's namespace)."""
    client, store, launcher, _ = env
    job = _succeeded_job(client, store, tmp_path)
    monkeypatch.setenv("HF_TOKEN", hub.token)
    hub.repos["acme/someone-elses"] = {"name": "someone-elses", "organization": "acme"}
    refused = client.post(f"/jobs/{job}/export", json={"kind": "adapter", "hub_repo": "acme/bot"})
    assert refused.status_code == 403, refused.text  # no namespace given to this tenant
    error = refused.json()["error"]
    assert error["code"] == "hub_push_not_allowed" and error["param"] == "hub_repo"
    assert "EFT_HUB_PUSH_NAMESPACES" in error["message"]
    monkeypatch.setenv("EFT_HUB_PUSH_NAMESPACES", '{"acme": ["acme"], "globex": ["operator"]}')
    get_settings.cache_clear()
    client.app.state.job_service.exports.settings = get_settings()
    outside = client.post(f"/jobs/{job}/export", json={"kind": "adapter", "hub_repo": "operator/model"})
    assert outside.status_code == 403 and "'acme/...'" in outside.json()["error"]["message"]
    assert hub.repos.keys() == {"acme/someone-elses"} and not launcher.__dict__.get("pending")
    # Into its own namespace: a repository that exists and that its exports did not create is
    # refused in the export's Ray Job, which pushes nothing there.
    assert client.post(f"/jobs/{job}/export", json={"kind": "adapter", "hub_repo": "acme/someone-elses"}).status_code == 202
    assert exports.run(*launcher.pending) == 1
    (failed,) = [e for e in client.get(f"/jobs/{job}/exports").json()["data"] if e.get("hub_repo") == "acme/someone-elses"]
    assert failed["status"] == "failed" and "not created by this tenant's exports" in failed["error"]
    assert "acme/someone-elses" not in hub.commits
    # A new one is created and pushed; the tenant's next push there is its own repository's.
    for kind in ("adapter", "merged"):
        assert client.post(f"/jobs/{job}/export", json={"kind": kind, "hub_repo": "acme/new"}).status_code == 202
        assert exports.run(*launcher.pending) == 0
    assert len(hub.commits["acme/new"]) == 2


def test_exports_per_tenant_are_capped_and_reserve_their_memory(env, tmp_path, monkeypatch):
    """Before: unbounded (20 merged exports of one tenant: 20 Ray Jobs, each loading the whole
    base with no memory reserved)."""
    client, store, launcher, _ = env
    monkeypatch.setenv("EFT_EXPORTS_PER_TENANT", "1")
    get_settings.cache_clear()
    client.app.state.job_service.exports.settings = get_settings()
    first, second = _succeeded_job(client, store, tmp_path), _succeeded_job(client, store, tmp_path)
    assert client.post(f"/jobs/{first}/export", json={"kind": "merged"}).status_code == 202
    weights = sum(f.stat().st_size for f in BASE.glob("*.safetensors"))
    assert launcher.memory == 2 * weights + 2**30
    busy = client.post(f"/jobs/{second}/export", json={"kind": "merged"})
    assert first != second and busy.status_code == 429, (first, second, busy.text)
    assert busy.json()["error"]["code"] == "exports_limit" and busy.headers["Retry-After"]
    assert exports.run(*launcher.pending) == 0  # the first one ends: room for the next
    assert client.post(f"/jobs/{second}/export", json={"kind": "merged"}).status_code == 202
    assert exports.memory_needed(str(BASE), "adapter") == 512 * 2**20  # pushing an adapter loads no base
