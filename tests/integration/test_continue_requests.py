"""Continuing a job from another's checkpoint, as requests see it (no Ray): the ways to name the
checkpoint, what the continued job takes from its source, the training config it gets, and the
refusals that name the field and the fix."""

from __future__ import annotations

import json

import pytest

from eft.types.jobs import JobStatus
from tests.helpers.app import validate_pending


@pytest.fixture
def source(service, eft_home, tmp_path):
    """A succeeded LoRA job (r=4, 3 steps) with kept checkpoints at steps 2 and 3."""
    client, store, settings = service
    turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    (eft_home / "data" / "train.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    job = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl", "name": "first",
                                     "method": {"type": "lora", "r": 4}, "hyperparameters": {"max_steps": 3}}).json()
    store.transition(job["id"], JobStatus.queued, "validated")
    store.transition(job["id"], JobStatus.running, "dispatched", attempt=1)
    for step in (2, 3):
        path = tmp_path / f"checkpoint_{step}"
        path.mkdir()
        store.record_checkpoint(job["id"], 1, step, str(path), {"loss": 1.0}, world_size=1, reason="interval",
                                size_bytes=1, save_seconds=0.1)
    store.transition(job["id"], JobStatus.succeeded, "done", artifact_path=str(tmp_path / "artifact"))
    return job


def test_each_way_of_naming_the_checkpoint(service, source):
    client, store, settings = service
    fine_tuned = client.get(f"/jobs/{source['id']}").json()["fine_tuned_model"]
    for given, expected_step in ((f"{source['id']}:2", 2), (source["id"], 3), (f"{fine_tuned}:ckpt-2", 2)):
        job = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl",
                                         "from_checkpoint": given, "hyperparameters": {"max_steps": 4}})
        assert job.status_code == 201, job.text
        assert job.json()["from_checkpoint"] == f"{source['id']}:{expected_step}"
    # A fine-tuned model id as `model`: its latest checkpoint, on its base model, its adapter's shape.
    by_model = client.post("/jobs", json={"model": fine_tuned, "training_file": "train.jsonl",
                                          "restore_optimizer": False, "hyperparameters": {"max_steps": 4}}).json()
    assert by_model["model"] == "tiny-llama" and by_model["from_checkpoint"] == f"{source['id']}:3"
    assert by_model["method"]["type"] == "lora" and by_model["method"]["r"] == 4
    validate_pending(store, settings)
    continued = store.get_job(by_model["id"])
    assert continued.status is JobStatus.queued, continued.error_message
    assert continued.config["init_job"] == source["id"] and continued.config["init_step"] == 3
    assert continued.config["init_optimizer"] is False and continued.config["total_steps"] == 4  # a new run
    assert continued.config["lora"]["r"] == 4
    resolved = client.get(f"/jobs/{by_model['id']}").json()["resolved"]
    assert resolved["continued_from"] == {"job_id": source["id"], "step": 3, "optimizer_state": False}


def test_with_optimizer_state_the_steps_come_after_the_sources(service, source):
    client, store, settings = service
    job = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl",
                                     "from_checkpoint": f"{source['id']}:2", "hyperparameters": {"max_steps": 5},
                                     "method": {"type": "dpo", "beta": 0.3}})
    # A DPO job on chat records is refused for its data, not for continuing: the continuation
    # itself (DPO from a supervised checkpoint, the adapter's shape kept) is accepted.
    assert job.status_code == 422 and job.json()["error"]["errors"][0]["param"] == "training_file"
    job = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl",
                                     "from_checkpoint": f"{source['id']}:2", "hyperparameters": {"max_steps": 5}}).json()
    validate_pending(store, settings)
    config = store.get_job(job["id"]).config
    assert config["init_optimizer"] is True and config["total_steps"] == 2 + 5


def test_refusals_name_the_field(client, source):
    for body, param, words in (
        ({"from_checkpoint": f"{source['id']}:9"}, "from_checkpoint", "kept: 2, 3"),
        ({"from_checkpoint": "ftjob-nope:1"}, "from_checkpoint", "no job"),
        ({"from_checkpoint": f"{source['id']}:x"}, "from_checkpoint", "is not"),
        ({"model": "ft:tiny-llama:first:ftjob-nope"}, "model", "no job"),
    ):
        refused = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl", **body})
        assert refused.status_code == 422, body
        error = refused.json()["error"]["errors"][0]
        assert error["param"] == param and error["code"] in ("checkpoint_not_found", "invalid_checkpoint")
        assert words in error["message"], error
