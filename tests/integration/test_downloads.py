"""Downloading what a job wrote through the API (`/jobs/{id}/artifacts`, `client.jobs.download`,
`eft jobs download`), and the model ids a succeeded job and its checkpoints get, over the real app
and store. The job's artifact is a real PEFT adapter of a bundled model; the job reaches
`succeeded` through the store's own lifecycle, as its driver moves it (the whole path, training
included, is in tests/e2e/test_openai_job.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json

import httpx
import pytest
from fastapi.testclient import TestClient

from eft.service.settings import BUNDLED_ASSETS, get_settings
from eft.service.store.store import Store
from eft.types.jobs import JobStatus
from tests.helpers.app import bearer, new_key, service_app


@pytest.fixture
def env(eft_home, tmp_path):
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    app = service_app(store, settings)
    keys_of = {t: new_key(store, t) for t in ("acme", "globex")}
    clients = {t: TestClient(app, headers=bearer(k)) for t, k in keys_of.items()}
    turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    (eft_home / "data" / "chat.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    with clients["acme"], clients["globex"]:
        yield clients, keys_of, store, tmp_path
    store.close()


def _adapter(where):
    """A real LoRA adapter of the bundled tiny Llama, with a file in a subfolder."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(BUNDLED_ASSETS / "models" / "tiny-llama")
    get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])).save_pretrained(where)
    (where / "tensorboard").mkdir()
    (where / "tensorboard" / "events.out").write_bytes(bytes(range(256)) * 5000)
    return where


def _succeed(store, job_id, artifact):
    store.transition(job_id, JobStatus.queued, "validated")
    store.transition(job_id, JobStatus.running, "dispatched", attempt=1)
    store.record_checkpoint(job_id, 1, 2, str(artifact), {"loss": 1.5}, reason="interval")
    store.transition(job_id, JobStatus.succeeded, "done", artifact_path=str(artifact))


def test_a_succeeded_jobs_files_download_checked_and_its_model_ids_resolve(env, monkeypatch):
    from typer.testing import CliRunner

    from eft import AsyncClient, Client
    from eft.cli import main as cli_module
    from eft.cli import output as cli_output

    clients, keys_of, store, tmp = env
    acme = clients["acme"]
    job = acme.post("/jobs", json={"model": "tiny-llama", "training_file": "chat.jsonl", "name": "bot"}).json()
    early = acme.get(f"/jobs/{job['id']}/artifacts")
    assert early.status_code == 409 and early.json()["error"]["code"] == "artifact_not_available"
    assert "validating" in early.json()["error"]["message"]

    source = _adapter(tmp / "published")
    _succeed(store, job["id"], source)
    listing = acme.get(f"/jobs/{job['id']}/artifacts").json()
    on_disk = {str(p.relative_to(source)): p for p in source.rglob("*") if p.is_file()}
    assert {f["path"] for f in listing["data"]} == set(on_disk) >= {"adapter_config.json", "tensorboard/events.out"}
    for f in listing["data"]:
        assert f["bytes"] == on_disk[f["path"]].stat().st_size
        assert f["sha256"] == hashlib.sha256(on_disk[f["path"]].read_bytes()).hexdigest()

    sync = Client(base_url="http://testserver", api_key=keys_of["acme"], http_client=acme, max_retries=0)
    written = sync.jobs.download(job["id"], tmp / "got")
    assert sorted(str(p.relative_to(tmp / "got")) for p in written) == sorted(on_disk)
    assert all((tmp / "got" / rel).read_bytes() == path.read_bytes() for rel, path in on_disk.items())
    assert not list((tmp / "got").rglob("*.part"))
    ckpt = sync.jobs.download(job["id"], tmp / "ckpt", checkpoint=2)
    assert len(ckpt) == len(on_disk)

    async def download_async():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=acme.app)) as raw:
            aclient = AsyncClient(base_url="http://testserver", api_key=keys_of["acme"], http_client=raw,
                                  max_retries=0)
            return await aclient.jobs.download(job["id"], tmp / "async")

    assert len(asyncio.run(download_async())) == len(on_disk)
    assert (tmp / "async" / "tensorboard" / "events.out").read_bytes() == (source / "tensorboard" / "events.out").read_bytes()

    monkeypatch.setattr(cli_output, "make_client", lambda base_url, api_key: sync)
    shown = CliRunner().invoke(cli_module.app, ["jobs", "download", job["id"], "-o", str(tmp / "cli"), "--json"])
    assert shown.exit_code == 0, shown.output
    assert len(json.loads(shown.output)["files"]) == len(on_disk)

    # What is not listed is not reachable; a checkpoint the job does not keep is a 404.
    for path, params in [("..%2F..%2Feft.db", {}), ("adapter_config.json", {"checkpoint": 5})]:
        r = acme.get(f"/jobs/{job['id']}/artifacts/{path}", params=params)
        assert r.status_code == 404 and r.json()["error"]["code"] == "artifact_not_found", r.text
    assert clients["globex"].get(f"/jobs/{job['id']}/artifacts").status_code == 404

    # The model ids: on the job, its checkpoints and /v1, for its tenant only.
    model = f"ft:tiny-llama:bot:{job['id']}"
    assert acme.get(f"/jobs/{job['id']}").json()["fine_tuned_model"] == model
    assert acme.get(f"/jobs/{job['id']}/checkpoints").json()["data"][0]["model"] == f"{model}:ckpt-2"
    assert acme.get(f"/v1/fine_tuning/jobs/{job['id']}").json()["fine_tuned_model"] == model
    assert model in [m["id"] for m in acme.get("/v1/models").json()["data"]]
    assert acme.get(f"/v1/models/{model}").json()["owned_by"] == "org-acme"
    assert acme.get(f"/v1/models/{model}:ckpt-2").status_code == 200
    assert clients["globex"].get(f"/v1/models/{model}").status_code == 404
    assert model not in [m["id"] for m in clients["globex"].get("/v1/models").json()["data"]]


def test_a_download_that_does_not_match_its_listing_leaves_nothing(tmp_path):
    from eft._errors import DownloadError
    from eft.downloads import _Sink
    from eft.types.jobs import ArtifactFile

    entry = ArtifactFile(path="sub/weights.bin", bytes=4, sha256=hashlib.sha256(b"abcd").hexdigest())
    good = _Sink(tmp_path, entry)
    good.write(b"abcd")
    assert good.finish().read_bytes() == b"abcd"
    bad = _Sink(tmp_path, entry.model_copy(update={"path": "other.bin"}))
    bad.write(b"abce")
    with pytest.raises(DownloadError, match="sha256"):
        bad.finish()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["weights.bin"]
    with pytest.raises(DownloadError, match="outside"):
        _Sink(tmp_path, entry.model_copy(update={"path": "../escape.bin"}))


def test_a_path_no_file_system_holds_is_a_404_naming_it(env):
    """A NUL, a name over 255 bytes or a path over 1024 characters is no file of the artifact (it
    answered 500: the local file system raised on it)."""
    clients, _, store, tmp_path = env
    client = clients["acme"]
    job = client.post("/jobs", json={"model": "tiny-llama", "training_file": "chat.jsonl"}).json()
    _succeed(store, job["id"], _adapter(tmp_path / "artifact"))
    for path in ("a%00b", "adapter_config.json%00", "a" * 5000, "x/" * 3000 + "y"):
        r = client.get(f"/jobs/{job['id']}/artifacts/{path}")
        assert r.status_code == 404, (path[:20], r.status_code, r.text[:200])
        assert r.json()["error"]["code"] == "artifact_not_found" and r.json()["error"]["param"] == "path"
    assert client.get(f"/jobs/{job['id']}/artifacts/adapter_config.json").status_code == 200


def test_an_artifacts_hashes_are_computed_once_at_publish(tmp_path, monkeypatch):
    """Before: listing an artifact read every byte of it to hash it, on an API thread, on each
    replica's first listing (another tenant's GET /jobs waited 8-18 s behind large ones). Now
    its publish records the hashes in the commit marker and a listing reads them; a file that
    changed since (its size differs) is hashed again."""
    from eft.service.serving import downloads
    from eft.training.artifacts import COMMIT_MARKER, publish

    source = _adapter(tmp_path / "adapter")
    target = publish(source, tmp_path / "published", {"job_id": "ftjob-x"})
    hashed = []
    real = downloads._sha256.__wrapped__

    def counting(uri, path, size, mtime_ns):
        hashed.append(path.rsplit("/", 1)[-1])
        return real(uri, path, size, mtime_ns)

    monkeypatch.setattr(downloads, "_sha256", counting)
    listing = downloads.list_files(target)
    on_disk = {str(p.relative_to(target)): p for p in (tmp_path / "published").rglob("*") if p.is_file()}
    assert {f["path"] for f in listing} == set(on_disk)
    for f in listing:
        assert f["sha256"] == hashlib.sha256(on_disk[f["path"]].read_bytes()).hexdigest(), f["path"]
    assert hashed == [COMMIT_MARKER]  # only the marker itself (a few hundred bytes)
    (tmp_path / "published" / "adapter_config.json").write_text("{}")  # changed after publish
    changed = {f["path"]: f["sha256"] for f in downloads.list_files(target)}
    assert changed["adapter_config.json"] == hashlib.sha256(b"{}").hexdigest()
