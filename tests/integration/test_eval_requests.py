"""Evaluation settings of a job request: what needs a validation file, what `publish: best`
takes, the defaults echoed back, and the best checkpoint marked from what the job reported."""

from __future__ import annotations

import json

import pytest

from eft.types.jobs import JobStatus


@pytest.fixture
def files(eft_home):
    turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    for name in ("train.jsonl", "valid.jsonl"):
        (eft_home / "data" / name).write_text(json.dumps({"messages": turns}) + "\n")


def test_a_job_without_evaluation_settings_passes_validation_as_stored(service, files):
    """The stored request holds every field with its default: none of them asks for an eval."""
    from tests.helpers.app import validate_pending

    client, store, settings = service
    job = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl"}).json()
    validate_pending(store, settings)
    assert client.get(f"/jobs/{job['id']}").json()["status"] == "queued"


def test_evaluation_settings_that_need_a_validation_file_or_an_adapter_are_refused(client, files):
    bad = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl", "publish": "best",
                                     "eval": {"every_steps": 5, "early_stopping_patience": 2}})
    assert bad.status_code == 422
    params = {e["param"]: e["code"] for e in bad.json()["error"]["errors"]}
    assert params == {"eval.every_steps": "validation_file_required",
                      "eval.early_stopping_patience": "validation_file_required",
                      "publish": "validation_file_required"}
    full = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl",
                                      "validation_file": "valid.jsonl", "method": {"type": "full"}, "publish": "best"})
    assert full.status_code == 422 and full.json()["error"]["errors"][0]["param"] == "publish"
    assert "full fine-tuning" in full.json()["error"]["errors"][0]["message"]
    for field, value in (("early_stopping_patience", 0), ("sample_prompts", 9), ("min_delta", -1)):
        wrong = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl",
                                           "validation_file": "valid.jsonl", "eval": {field: value}})
        assert wrong.status_code == 422 and wrong.json()["error"]["param"] == f"eval.{field}"


def test_defaults_echo_and_the_best_checkpoint_is_the_one_the_job_judged_best(service, files, tmp_path):
    client, store, _ = service
    job = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl",
                                     "validation_file": "valid.jsonl", "publish": "best"}).json()
    assert job["publish"] == "best" and job["eval"] == {
        "every_steps": None, "early_stopping_patience": None, "min_delta": 0.0, "sample_prompts": 3,
        "sample_max_tokens": 48}
    store.transition(job["id"], JobStatus.queued, "validated")
    store.transition(job["id"], JobStatus.running, "dispatched", attempt=1)
    # Step 4 has the lowest loss, but not lower than step 2's by the job's min_delta: the job
    # judged step 2 best, and said so in every evaluated checkpoint's metrics.
    for step in (2, 4, 6, 7):
        (tmp_path / f"ckpt-{step}").mkdir()
    for step, loss, best_step in ((2, 3.0, 2), (4, 2.99, 2), (6, 3.5, 2)):
        store.record_checkpoint(job["id"], 1, step, str(tmp_path / f"ckpt-{step}"),
                                {"eval_loss": loss, "best_step": best_step}, reason="interval")
    store.record_checkpoint(job["id"], 1, 7, str(tmp_path / "ckpt-7"), {"loss": 1.0}, reason="time")
    checkpoints = {c["step"]: c for c in client.get(f"/jobs/{job['id']}/checkpoints").json()["data"]}
    assert [s for s, c in checkpoints.items() if c["best"]] == [2]
    assert checkpoints[4]["eval_loss"] == 2.99 and checkpoints[7]["eval_loss"] is None
    # Once step 2 is pruned, the kept checkpoint with the lowest loss is marked.
    (tmp_path / "ckpt-2").rmdir()
    checkpoints = client.get(f"/jobs/{job['id']}/checkpoints").json()["data"]
    assert [c["step"] for c in checkpoints if c["best"]] == [4]
