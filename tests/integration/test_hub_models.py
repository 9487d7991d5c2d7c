"""Hugging Face hub ids as base models, offline: a cache the test builds (the layout
huggingface_hub writes) stands for what a download left; a model in it resolves to its pinned
commit and is planned, tokenised and loaded from there; one that is not is a 422 at once."""

from __future__ import annotations

import json
import time

import pytest

from eft.service.settings import get_settings
from tests.helpers.app import validate_pending
from tests.helpers.hub import cached_model
from tests.helpers.paths import REPO

MODELS = REPO / "assets" / "models"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path):
    """`acme/tiny-qwen` at COMMIT, with main pointing there, as huggingface_hub lays it out."""
    cached_model(tmp_path / "hf-cache", "acme/tiny-qwen", MODELS / "tiny-qwen2.5", COMMIT)
    return tmp_path / "hf-cache"


@pytest.fixture
def hub_settings(eft_home, hub_cache, monkeypatch):
    monkeypatch.setenv("EFT_ALLOW_HUB_MODELS", "true")
    monkeypatch.setenv("EFT_HUB_OFFLINE", "true")
    monkeypatch.setenv("EFT_HUB_CACHE_DIR", str(hub_cache))
    get_settings.cache_clear()


@pytest.fixture
def client(hub_settings, service, eft_home):
    (eft_home / "data" / "chat.jsonl").write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"What is {i} plus one?"},
        {"role": "assistant", "content": f"It is {i + 1}."}]}) + "\n" for i in range(6)))
    return service


def test_a_cached_hub_model_is_pinned_planned_and_loadable(client):
    c, store, settings = client
    r = c.post("/jobs", json={"model": "acme/tiny-qwen", "training_file": "chat.jsonl"})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    assert store.get_job(job_id).plan["attention"] == "sdpa"
    validate_pending(store, settings)
    job = store.get_job(job_id)
    assert job.status.value == "queued", job.error_message
    hub = job.config["hub"]
    assert hub["repo_id"] == "acme/tiny-qwen" and hub["revision"] == COMMIT
    # The workers' path: from_pretrained(repo id, pinned revision, cache), no network.
    from eft.training.config import TrainConfig
    from eft.training.model import load_trainable_model

    model = load_trainable_model(TrainConfig.from_dict(job.config))
    assert type(model).__name__ == "PeftModelForCausalLM"
    assert model.base_model.model.config.model_type == "qwen2"


def test_an_uncached_hub_model_offline_is_a_422_within_two_seconds(client):
    c, _, _ = client
    started = time.perf_counter()
    r = c.post("/jobs", json={"model": "acme/not-downloaded", "training_file": "chat.jsonl"})
    elapsed = time.perf_counter() - started
    assert r.status_code == 422 and elapsed < 2.0, (r.text, elapsed)
    problem = r.json()["error"]["errors"][0]
    assert problem["param"] == "model" and problem["code"] == "hub_unreachable"
    assert "not in" in problem["message"] and "local model directory" in problem["message"]


def test_hub_datasets_resolve_through_the_cache_at_a_pinned_commit(client, hub_cache):
    import pyarrow as pa
    import pyarrow.parquet as pq

    c, store, settings = client
    snapshot = hub_cache / "datasets--acme--chat" / "snapshots" / COMMIT
    (snapshot / "data").mkdir(parents=True)
    rows = [{"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                          {"role": "assistant", "content": f"It is {i + 1}."}]} for i in range(5)]
    pq.write_table(pa.Table.from_pylist(rows), snapshot / "data" / "train-00000.parquet")
    pq.write_table(pa.Table.from_pylist(rows[:2]), snapshot / "data" / "test-00000.parquet")
    (hub_cache / "datasets--acme--chat" / "refs").mkdir()
    (hub_cache / "datasets--acme--chat" / "refs" / "main").write_text(COMMIT)
    r = c.post("/jobs", json={"model": "acme/tiny-qwen", "training_file": "hf://datasets/acme/chat",
                              "validation_file": "hf://datasets/acme/chat/data/test-00000.parquet"})
    assert r.status_code == 201, r.text
    validate_pending(store, settings)
    job = store.get_job(r.json()["id"])
    assert job.status.value == "queued", job.error_message
    assert COMMIT in job.config["training_file"] and job.config["num_train_examples"] == 5
    queued = [e for e in store.list_events(job.id)[0] if e.type == "queued"][0]
    assert queued.data["validation_examples"] == 2
    missing = c.post("/jobs", json={"model": "acme/tiny-qwen", "training_file": "hf://datasets/acme/none"})
    problem = missing.json()["error"]["errors"][0]
    assert missing.status_code == 422 and problem["code"] == "hub_unreachable" and problem["param"] == "training_file"


@pytest.fixture
def online_hub(eft_home, tmp_path, monkeypatch):
    """The service reading Hub ids from a Hub on loopback, with an operator token set."""
    from tests.helpers.hub import FakeHub

    fake = FakeHub()
    tokenizer_files = MODELS / "tiny-qwen2.5"
    fake.add("acme/private-model", tokenizer_files, private=True)
    fake.add("public/model", tokenizer_files)
    fake.add("public/huge-tokenizer", tokenizer_files, sizes={"tokenizer.json": 500 * 2**20})
    monkeypatch.setenv("HF_TOKEN", fake.token)
    monkeypatch.setenv("EFT_ALLOW_HUB_MODELS", "true")
    monkeypatch.setenv("EFT_HUB_OFFLINE", "false")
    monkeypatch.setenv("EFT_HUB_CACHE_DIR", str(tmp_path / "hf-online-cache"))
    monkeypatch.setenv("EFT_HUB_ENDPOINT", fake.url)
    get_settings.cache_clear()
    (eft_home / "data" / "chat.jsonl").write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"What is {i} plus one?"},
        {"role": "assistant", "content": f"It is {i + 1}."}]}) + "\n" for i in range(6)))
    yield fake
    fake.close()


def test_hub_ids_are_read_without_the_operators_token_unless_allowed(online_hub, service, monkeypatch):
    """Before: every Hub id was fetched with the operator's HF_TOKEN, so a tenant trained on
    (and downloaded) the operator's private model."""
    client, store, settings = service
    private = client.post("/jobs", json={"model": "acme/private-model", "training_file": "chat.jsonl"})
    assert private.status_code == 422, private.text
    (problem,) = private.json()["error"]["errors"]
    assert problem["param"] == "model" and problem["code"] == "hub_model_not_found"
    assert "EFT_HUB_READ_REPOS" in problem["message"]
    assert online_hub.requests and not online_hub.sent_token()  # asked anonymously
    public = client.post("/jobs", json={"model": "public/model", "training_file": "chat.jsonl"})
    assert public.status_code == 201, public.text
    assert not online_hub.sent_token()
    validate_pending(store, settings)
    job = store.get_job(public.json()["id"])
    assert job.status.value == "queued", job.error_message
    assert job.config["hub"]["use_token"] is False  # and the workers fetch it anonymously too
    # The operator lets this tenant read its organisation with the token.
    monkeypatch.setenv("EFT_HUB_READ_REPOS", '{"default": ["acme/*"]}')
    get_settings.cache_clear()
    client.app.state.job_service.settings = get_settings()
    allowed = client.post("/jobs", json={"model": "acme/private-model", "training_file": "chat.jsonl"})
    assert allowed.status_code == 201, allowed.text
    assert online_hub.sent_token()
    validate_pending(store, client.app.state.job_service.settings)
    assert store.get_job(allowed.json()["id"]).config["hub"]["use_token"] is True


def test_a_hub_models_files_are_sized_from_the_listing_before_any_download(online_hub, service):
    client, *_ = service
    refused = client.post("/jobs", json={"model": "public/huge-tokenizer", "training_file": "chat.jsonl"})
    assert refused.status_code == 422, refused.text
    (problem,) = refused.json()["error"]["errors"]
    assert problem["code"] == "hub_files_too_large" and problem["param"] == "model"
    assert not [p for method, p, _ in online_hub.requests if "/resolve/" in p]  # nothing downloaded
