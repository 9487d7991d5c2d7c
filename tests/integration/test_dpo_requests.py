"""DPO job requests through the real app: the method's shape on `/jobs` and `/v1`, what the
data must be, per-record errors with line numbers, the planner's count of a full fine-tune's
reference copy, and the training config a validated job carries."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.helpers.app import validate_pending
from tests.helpers.paths import REPO


DEMO = REPO / "assets" / "data" / "demo"


@pytest.fixture
def files(eft_home):
    for name in ("preference_train.jsonl", "preference_valid.jsonl", "chat_train.jsonl"):
        shutil.copy(DEMO / name, eft_home / "data" / name)
    return eft_home / "data"


def _dpo(**method):
    return {"model": "tiny-llama", "training_file": "preference_train.jsonl",
            "validation_file": "preference_valid.jsonl", "method": {"type": "dpo", **method},
            "hyperparameters": {"max_steps": 3}}


def test_a_dpo_job_is_accepted_validated_and_configured(service, files):
    client, store, settings = service
    created = client.post("/jobs", json=_dpo(beta=0.2, tuning={"type": "lora", "r": 4}))
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["method"]["type"] == "dpo" and job["method"]["beta"] == 0.2
    assert job["method"]["tuning"]["type"] == "lora" and job["method"]["tuning"]["r"] == 4
    validate_pending(store, settings)
    record = store.get_job(job["id"])
    assert record.status.value == "queued", record.error
    assert record.config["objective"] == "dpo" and record.config["dpo_beta"] == 0.2
    assert record.config["method"] == "lora" and record.config["lora"]["r"] == 4
    assert record.config["num_train_examples"] == 600  # pairs
    # The default: LoRA DPO with beta 0.1.
    default = client.post("/jobs", json=_dpo()).json()
    assert default["method"]["beta"] == 0.1 and default["method"]["tuning"]["type"] == "lora"


def test_data_of_the_wrong_kind_is_refused_naming_the_file_and_the_fix(client, files):
    chat = client.post("/jobs", json={**_dpo(), "training_file": "chat_train.jsonl"})
    assert chat.status_code == 422
    error = chat.json()["error"]["errors"][0]
    assert error["param"] == "training_file" and error["code"] == "preference_records_required"
    assert "preferred_output" in error["message"]
    sft = client.post("/jobs", json={"model": "tiny-llama", "training_file": "preference_train.jsonl"})
    assert sft.status_code == 422
    error = sft.json()["error"]["errors"][0]
    assert error["param"] == "training_file" and error["code"] == "preference_records_need_dpo"
    assert '"dpo"' in error["message"]


def test_each_bad_pair_is_named_by_line_and_field(client, files):
    lines = (DEMO / "preference_train.jsonl").read_text().splitlines()[:4]
    rows = [json.loads(line) for line in lines]
    del rows[1]["non_preferred_output"]
    rows[2]["preferred_output"] = [{"role": "assistant", "content": "  "}]
    rows[3]["input"]["messages"].append({"role": "assistant", "content": "already answered"})
    (files / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    bad = client.post("/jobs", json={**_dpo(), "training_file": "bad.jsonl"})
    assert bad.status_code == 422
    params = {e["param"] for e in bad.json()["error"]["errors"]}
    assert "training_file:line 2:non_preferred_output" in params
    assert "training_file:line 3:preferred_output[0].content" in params
    assert any(p.startswith("training_file:line 4:input.messages[") and p.endswith("].role") for p in params)
    assert not any(":line 1:" in p for p in params)


def test_dpo_method_fields_are_checked(client, files):
    for method, param in (({"beta": 0}, "method.dpo.beta"), ({"tuning": {"type": "dpo"}}, "method.dpo.tuning")):
        bad = client.post("/jobs", json=_dpo(**method))
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"]["param"].startswith(param), bad.json()


def test_a_full_dpo_plan_counts_the_reference_copy(service, files):
    """Full DPO keeps a frozen copy of the base beside the trained one: the planner's prediction
    exceeds full supervised training's on the same request by the copy's fp32 bytes."""
    client, store, settings = service
    sft_body = {"model": "tiny-llama", "training_file": "chat_train.jsonl", "method": {"type": "full"},
                "hyperparameters": {"max_steps": 3}}
    sft = client.post("/jobs", json=sft_body).json()
    full = client.post("/jobs", json=_dpo(tuning={"type": "full"}))
    assert full.status_code == 201, full.text
    validate_pending(store, settings)
    dpo_config, sft_config = store.get_job(full.json()["id"]).config, store.get_job(sft["id"]).config
    assert dpo_config["method"] == "full" and dpo_config["objective"] == "dpo"
    assert dpo_config["predicted_memory_gb"] > sft_config["predicted_memory_gb"]


def test_v1_creates_a_dpo_job_in_openais_shape(client, files):
    upload = client.post("/v1/files", data={"purpose": "fine-tune"},
                         files={"file": ("pairs.jsonl", (DEMO / "preference_train.jsonl").read_bytes())})
    assert upload.is_success, upload.text
    body = {"model": "tiny-llama", "training_file": upload.json()["id"],
            "method": {"type": "dpo", "dpo": {"hyperparameters": {"beta": 0.3, "n_epochs": 1, "batch_size": 8}}}}
    created = client.post("/v1/fine_tuning/jobs", json=body)
    assert created.is_success, created.text
    job = created.json()
    assert job["method"]["type"] == "dpo"
    assert job["method"]["dpo"]["hyperparameters"]["beta"] == 0.3
    assert job["hyperparameters"]["batch_size"] == 8
    ours = client.get(f"/jobs/{job['id']}").json()
    assert ours["method"]["type"] == "dpo" and ours["method"]["beta"] == 0.3
    wrong = client.post("/v1/fine_tuning/jobs", json={**body, "method": {"type": "dpo", "dpo": {
        "hyperparameters": {"beta": -1}}}})
    assert wrong.status_code == 422 and "beta" in wrong.json()["error"]["message"], wrong.json()
