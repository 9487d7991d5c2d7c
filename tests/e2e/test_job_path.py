"""The whole path over real HTTP: Ray Serve -> scheduler -> Ray Job -> Ray Train (2 workers)
-> adapter on disk, loaded back with plain PEFT in a fresh process; plus cancel and a job that
fails validation with a user error."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import as_json, client, wait_for

pytestmark = pytest.mark.e2e

LORA_JOB = {
    "model": "tiny-llama",
    "training_file": "demo/chat_train.jsonl",
    "validation_file": "demo/chat_valid.jsonl",
    "method": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0},
    "hyperparameters": {"max_steps": 12, "learning_rate": 3e-3, "global_batch_size": 16,
                        "micro_batch_size": 4, "max_seq_len": 128, "warmup_steps": 2},
    "scaling": {"min_workers": 2},
    "checkpoint": {"every_steps": 5, "keep": 2},
    "name": "e2e-lora",
}

LOAD_IN_FRESH_PROCESS = textwrap.dedent("""
    import json, sys, torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    base_dir, adapter_dir, valid = sys.argv[1:4]
    tok = AutoTokenizer.from_pretrained(adapter_dir)
    rows = [json.loads(l) for l in open(valid)][:32]
    def loss(model):
        total, n = 0.0, 0
        for row in rows:
            out = tok.apply_chat_template(row["messages"], return_dict=True,
                                          return_assistant_tokens_mask=True, return_tensors="pt")
            labels = out["input_ids"].clone()
            labels[out["assistant_masks"] == 0] = -100
            with torch.no_grad():
                l = model(input_ids=out["input_ids"], labels=labels).loss
            k = int((labels[:, 1:] != -100).sum())
            total, n = total + float(l) * k, n + k
        return total / n
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    before = loss(base)
    tuned = PeftModel.from_pretrained(base, adapter_dir)
    print(json.dumps({"before": before, "after": loss(tuned),
                      "type": type(tuned).__name__, "modules": sorted(tuned.peft_config["default"].target_modules)}))
""")


def _post(url: str, body: dict) -> dict:
    return as_json(client(url).jobs.create(body))


def test_lora_job_over_http_produces_a_loadable_adapter(service):
    url = service["url"]
    job = _post(url, LORA_JOB)
    done = wait_for(job["id"], url, {"succeeded"})
    assert done["attempt"] == 1 and done["num_workers"] == 2 and done["step"] == 12
    assert done["ray_submission_id"] == f"{job['id']}-attempt-1"
    artifact = Path(done["artifact_path"])
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json",
            "eft_manifest.json"} <= {p.name for p in artifact.iterdir()}

    manifest = json.loads((artifact / "eft_manifest.json").read_text())
    assert manifest["job_id"] == job["id"] and manifest["method"] == "lora"
    assert len(manifest["base_model"]["fingerprint_sha256"]) == 64
    assert len(manifest["datasets"]["training_file"]["sha256"]) == 64
    assert manifest["hyperparameters"]["global_batch_size"] == 16
    assert manifest["strategy"] == done["resolved"]["strategy"]  # planned: strategy was auto
    memory = manifest["memory_gb"]
    assert memory["predicted_per_worker"] > 0 and len(memory["measured_peak_per_worker"]) == 2
    assert all(m > 0.05 for m in memory["measured_peak_per_worker"])
    assert manifest["final_metrics"]["eval_loss"] == pytest.approx(done["result_metrics"]["eval_loss"])

    metrics = as_json(client(url).jobs.metrics(job["id"]))["data"]
    steps = [m for m in metrics if "loss" in m["values"]]
    assert [m["step"] for m in steps] == list(range(1, 13))
    assert all(m["values"]["world_size"] == 2 and m["values"]["tokens_per_s"] > 0 for m in steps)
    assert steps[-1]["values"]["loss"] < steps[0]["values"]["loss"]
    assert steps[0]["values"]["learning_rate"] < steps[2]["values"]["learning_rate"]  # warmup

    events = [e.type for e in client(url).jobs.list_events(job["id"])]
    for expected in ("created", "queued", "dispatched", "submitted", "training_started",
                     "checkpoint_saved", "succeeded"):
        assert expected in events
    assert events.index("queued") < events.index("dispatched") < events.index("succeeded")
    checkpoints = client(url).jobs.checkpoints(job["id"])
    assert [c.step for c in checkpoints] == [5, 10, 12]

    base_dir = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-llama"
    valid = Path(__file__).resolve().parents[2] / "assets" / "data" / "demo" / "chat_valid.jsonl"
    out = subprocess.run([sys.executable, "-c", LOAD_IN_FRESH_PROCESS, str(base_dir), str(artifact), str(valid)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["type"] == "PeftModelForCausalLM"
    assert loaded["after"] < loaded["before"] - 0.5, loaded


def test_minimal_request_as_in_the_readme(service):
    """`curl -X POST /jobs -d '{"model": ..., "training_file": ...}'`: defaults do the rest."""
    url = service["url"]
    job = _post(url, {"model": "tiny-llama", "training_file": "demo/completion_train.jsonl"})
    assert job["hyperparameters"]["global_batch_size"] == 8 and job["scaling"]["min_workers"] == 1
    done = wait_for(job["id"], url, {"succeeded"})
    assert done["total_steps"] and done["step"] == done["total_steps"]
    assert (Path(done["artifact_path"]) / "adapter_model.safetensors").is_file()


def test_cancel_stops_the_ray_job_and_its_workers(service, tmp_path):
    """A running job's checkpoint answers chat through the model servers before the job ends.
    Cancelling kills the attempt's Ray Job: its workers and controller end, and its placement
    group goes with the job (no detached cleaner is needed for that)."""
    from openai import OpenAI
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors, list_placement_groups

    from eft.service.settings import BUNDLED_ASSETS
    from eft.training.checkpoint import load_trainable
    from tests.conftest import reference_reply
    from tests.e2e.conftest import ADMIN_KEY

    url = service["url"]
    # Under DeepSpeed ZeRO-2, so the service path runs a sharded strategy too.
    body = {**LORA_JOB, "hyperparameters": {**LORA_JOB["hyperparameters"], "max_steps": 100000},
            "name": "e2e-cancel", "strategy": "zero2", "checkpoint": {"every_steps": 5, "keep": 20}}
    job = _post(url, body)
    deadline = time.monotonic() + 300
    while not (kept := [c for c in as_json(client(url).jobs.checkpoints(job["id"]))["data"] if c["available"]]):
        assert time.monotonic() < deadline, "the job never kept a checkpoint"
        time.sleep(0.5)
    checkpoint = kept[-1]
    shutil.copytree(checkpoint["path"], tmp_path / "checkpoint")
    openai = OpenAI(base_url=f"{url}/v1", api_key=ADMIN_KEY, max_retries=0, timeout=300)
    question = [{"role": "user", "content": "What is the first word of: frog fox high king"}]
    reply = openai.chat.completions.create(model=checkpoint["model"], messages=question, max_tokens=12,
                                           temperature=0)
    assert as_json(client(url).jobs.retrieve(job["id"]))["status"] == "running"
    # What plain PEFT answers from the checkpoint's weights (gathered from ZeRO-2's shards).
    state = load_trainable(tmp_path / "checkpoint")
    assert reply.choices[0].message.content == reference_reply(
        BUNDLED_ASSETS / "models" / "tiny-llama", tmp_path / "checkpoint" / "adapter", question,
        max_new_tokens=12, state=state)
    assert reply.usage.completion_tokens <= 12 and reply.model == checkpoint["model"]
    assert client(url).jobs.cancel(job["id"]).status.value in ("cancelling", "cancelled")
    started = time.monotonic()
    done = wait_for(job["id"], url, {"cancelled"}, timeout_s=120)
    assert done["finished_at"] and time.monotonic() - started < 60
    ray_jobs = JobSubmissionClient(service["dashboard_url"])
    assert ray_jobs.get_job_status(done["ray_submission_id"]).value == "STOPPED"
    ray_job_id = ray_jobs.get_job_info(done["ray_submission_id"]).job_id
    deadline = time.monotonic() + 60
    while True:
        # This job's: trainers run in the test process itself (test_strategies.py) are not.
        actors = list_actors(address=service["dashboard_url"], filters=[("state", "=", "ALIVE"),
                                                                         ("job_id", "=", ray_job_id)])
        alive = [a for a in actors
                 if "TrainWorker" in a.class_name or "TrainController" in a.class_name]
        if not alive:
            break
        assert time.monotonic() < deadline, f"train actors still alive: {alive}"
        time.sleep(1)
    started_by_job = {a.class_name for a in list_actors(
        address=service["dashboard_url"], filters=[("job_id", "=", ray_job_id)], limit=1000)}
    assert {"TrainController", "RayTrainWorker", "ProgressSink"} <= started_by_job, started_by_job
    # Helpers a job has no use for are not started, and the preemption watcher runs in the
    # controller (training/driver.py:JobTrainer).
    assert not started_by_job & {"DatasetManager", "PlacementGroupCleaner", "PreemptionWatcher"}, started_by_job
    while True:
        held = list_placement_groups(address=service["dashboard_url"], filters=[("state", "=", "CREATED")],
                                     detail=True)
        held = [pg for pg in held if pg.creator_job_id == ray_job_id]
        if not held:
            break
        assert time.monotonic() < deadline, f"placement groups left behind: {held}"
        time.sleep(1)


def test_data_that_cannot_train_fails_with_a_user_error(service):
    url = service["url"]
    data = service["home"] / "data" / "long_prompts.jsonl"
    row = {"prompt": "word " * 200, "completion": "answer"}
    data.write_text(json.dumps(row) + "\n")
    job = _post(url, {"model": "tiny-llama", "training_file": str(data),
                      "hyperparameters": {"max_seq_len": 16}})
    deadline = time.monotonic() + 120
    while (failed := as_json(client(url).jobs.retrieve(job["id"])))["status"] != "failed":
        assert failed["status"] in ("validating",), failed
        assert time.monotonic() < deadline
        time.sleep(0.5)
    # The only record has no room for its answer: none is left to train on.
    assert failed["error"]["code"] == "user_error.no_loss_tokens"
    assert failed["error"]["param"] == "training_file"
    assert "line 1" in failed["error"]["message"] and "max_seq_len" in failed["error"]["message"]
    assert failed["attempt"] == 0  # never dispatched


QLORA_LOAD = textwrap.dedent("""
    import json, sys, torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig
    base_dir, adapter_dir = sys.argv[1:3]
    q = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(base_dir, quantization_config=q)
    ids = torch.tensor([[2, 5, 100, 200, 300, 7, 6]])
    before = base(input_ids=ids).logits
    tuned = PeftModel.from_pretrained(base, adapter_dir)
    after = tuned(input_ids=ids).logits
    layers = sum(type(m).__module__.startswith("bitsandbytes") and type(m).__name__ == "Linear4bit"
                 for m in tuned.modules())
    print(json.dumps({"changed": float((after - before).abs().max()), "linear4bit": layers}))
""")


def test_qlora_job_trains_on_4bit_base_weights(service):
    url = service["url"]
    body = {**LORA_JOB, "method": {"type": "qlora", "r": 8, "alpha": 16, "quant_type": "nf4"},
            "hyperparameters": {**LORA_JOB["hyperparameters"], "max_steps": 8}, "name": "e2e-qlora",
            "checkpoint": {"every_steps": 100, "keep": 1}}
    job = _post(url, body)
    done = wait_for(job["id"], url, {"succeeded"})
    # Every linear layer of the 4 decoder layers (7 each) held 4-bit weights while training.
    assert done["result_metrics"]["quantized_linear_layers"] == 28
    losses = [m["values"]["loss"] for m in as_json(client(url).jobs.metrics(job["id"]))["data"]
              if "loss" in m["values"]]
    assert len(losses) == 8 and losses[-1] < losses[0]
    manifest = json.loads((Path(done["artifact_path"]) / "eft_manifest.json").read_text())
    assert manifest["method"] == "qlora" and manifest["lora"]["quant_type"] == "nf4"
    base_dir = Path(__file__).resolve().parents[2] / "assets" / "models" / "tiny-llama"
    out = subprocess.run([sys.executable, "-c", QLORA_LOAD, str(base_dir), done["artifact_path"]],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["linear4bit"] == 28 and loaded["changed"] > 1e-3
