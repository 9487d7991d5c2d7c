"""Journey: how jobs end, each one way, over real HTTP: a request with only the required fields
takes the defaults; a QLoRA job trains on 4-bit base weights, and its evaluation during training
stops it early and publishes the best step (one job for both ways: evaluation works on any
method's model, and a QLoRA job is the one whose evaluation is not the common LoRA path); data that cannot train fails validation with a user error; a running
job's checkpoint answers chat before the job ends, and cancelling it stops its Ray Job, workers
and placement group.

The jobs that run to their end are posted with every other job of the e2e tier at once
(tests/e2e/conftest.py:journey); the one cancelled trains until it is, so it starts in its test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eft.training.checkpoint import load_trainable
from tests.helpers.budgets import machine_factor
from tests.helpers.jobs import post
from tests.helpers.paths import TINY_LLAMA
from tests.helpers.payloads import LORA_JOB
from tests.helpers.service_api import as_json, client, wait_for


def test_minimal_request_as_in_the_readme(service, journey):
    """`curl -X POST /jobs -d '{"model": ..., "training_file": ...}'`: defaults do the rest."""
    url, job = service["url"], journey.jobs["minimal"]
    assert job["hyperparameters"]["global_batch_size"] == 8 and job["scaling"]["min_workers"] == 1
    done = wait_for(job["id"], url, {"succeeded"})
    assert done["total_steps"] and done["step"] == done["total_steps"]
    assert (Path(done["artifact_path"]) / "adapter_model.safetensors").is_file()


def test_eval_curve_samples_early_stop_and_the_best_step_published(service, journey):
    """Evaluation during training: the validation loss every few steps (the eval curve in the
    job's metrics), replies to validation prompts at each evaluation, early stopping with a
    patience, the best checkpoint marked, and the best step's weights published."""
    url, job = service["url"], journey.jobs["eval_qlora"]
    eft = client(url)
    done = wait_for(job["id"], url, {"succeeded"})
    assert done["step"] == 6 and done["total_steps"] == 40
    result = done["result_metrics"]
    assert result["stopped_early"] == 1 and result["best_step"] == 2 and result["published_step"] == 2

    # The eval curve: a validation loss at every evaluation, in the job's metrics.
    metrics = as_json(eft.jobs.metrics(job["id"]))["data"]
    curve = {m["step"]: m["values"]["eval_loss"] for m in metrics if "eval_loss" in m["values"]}
    assert sorted(curve) == [2, 4, 6] and all(0 < v < 20 for v in curve.values())
    assert result["eval_loss"] == pytest.approx(curve[6])

    events = as_json(eft.jobs.list_events(job["id"], limit=1000))["data"]
    stopped = [e for e in events if e["type"] == "early_stopped"]
    assert len(stopped) == 1 and stopped[0]["data"]["step"] == 6 and stopped[0]["data"]["best_step"] == 2
    samples = [e["data"] for e in events if e["type"] == "eval_samples"]
    assert [s["step"] for s in samples] == [2, 4, 6]
    for s in samples:
        assert len(s["samples"]) == 2 and all(x["prompt"] and x["reference"] for x in s["samples"])
        assert s["eval_loss"] == pytest.approx(curve[s["step"]])
    assert [x["prompt"] for x in samples[0]["samples"]] == [x["prompt"] for x in samples[-1]["samples"]]

    # Checkpoints carry their validation loss; the best one (by the job's own judgement, with
    # its min_delta) is marked.
    checkpoints = {c["step"]: c for c in as_json(eft.jobs.checkpoints(job["id"]))["data"]}
    assert sorted(checkpoints) == [2, 4, 6] and checkpoints[6]["reason"] == "final"
    assert [s for s, c in checkpoints.items() if c["best"]] == [2]
    assert checkpoints[4]["eval_loss"] == pytest.approx(curve[4])

    # The artifact holds step 2's weights (publish "best"), not step 6's.
    published = load_file(str(Path(done["artifact_path"]) / "adapter_model.safetensors"))
    best = load_trainable(Path(checkpoints[2]["path"]))
    last = load_trainable(Path(checkpoints[6]["path"]))
    renamed = {k.replace(".default.", "."): v for k, v in best.items()}
    assert set(published) == set(renamed)
    assert all(torch.equal(published[k], renamed[k]) for k in published)
    assert any(not torch.equal(best[k], last[k]) for k in best)


def test_data_that_cannot_train_fails_with_a_user_error(service, journey):
    url, job = service["url"], journey.jobs["user_error"]
    deadline = time.monotonic() + 120 * machine_factor()
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


def test_qlora_job_trains_on_4bit_base_weights(service, journey):
    """The evaluating job above, a QLoRA one: it trained on 4-bit weights, and its adapter (the
    best step's) loads onto a 4-bit base with plain PEFT and changes its output."""
    url, job = service["url"], journey.jobs["eval_qlora"]
    done = wait_for(job["id"], url, {"succeeded"})
    # Every linear layer of the 4 decoder layers (7 each) held 4-bit weights while training.
    assert done["result_metrics"]["quantized_linear_layers"] == 28
    losses = [m["values"]["loss"] for m in as_json(client(url).jobs.metrics(job["id"]))["data"]
              if "loss" in m["values"]]
    assert len(losses) == 6 and all(loss == loss for loss in losses) and losses[-1] < losses[0], losses
    manifest = json.loads((Path(done["artifact_path"]) / "eft_manifest.json").read_text())
    assert manifest["method"] == "qlora" and manifest["lora"]["quant_type"] == "nf4"
    base_dir = TINY_LLAMA
    out = subprocess.run([sys.executable, "-c", QLORA_LOAD, str(base_dir), done["artifact_path"]],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["linear4bit"] == 28 and loaded["changed"] > 1e-3


def _chat_with_a_checkpoint_of_the_running_job(url: str, job: dict, tmp_path) -> None:
    """The job's latest kept checkpoint answers chat through the model servers, as plain PEFT
    answers from its weights, while the job still runs."""
    from openai import OpenAI

    from eft.service.settings import BUNDLED_ASSETS
    from eft.training.checkpoint import load_trainable
    from tests.helpers.reference import reference_reply
    from tests.helpers.service_api import ADMIN_KEY

    deadline = time.monotonic() + 300 * machine_factor()
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


def test_cancel_stops_the_ray_job_and_its_workers(service, tmp_path):
    """A running job's checkpoint answers chat through the model servers before the job ends.
    Cancelling kills the attempt's Ray Job: its workers and controller end, and its placement
    group goes with the job (no detached cleaner is needed for that)."""
    from ray.job_submission import JobSubmissionClient
    from ray.util.state import list_actors, list_placement_groups

    url = service["url"]
    # Under DeepSpeed ZeRO-2, so the service path runs a sharded strategy too.
    body = {**LORA_JOB, "hyperparameters": {**LORA_JOB["hyperparameters"], "max_steps": 100000},
            "name": "e2e-cancel", "strategy": "zero2", "trackers": {},
            # Every checkpoint kept while the test chats with one (up to 1000 steps): a pruned one
            # would answer 404.
            "checkpoint": {"every_steps": 10, "keep": 100}}
    job = post(url, body)
    try:
        _chat_with_a_checkpoint_of_the_running_job(url, job, tmp_path)
    finally:  # cancelled whatever the chat did: a job of 100000 steps left running would slow the tier
        cancelling = client(url).jobs.cancel(job["id"]).status.value
        started = time.monotonic()
    assert cancelling in ("cancelling", "cancelled")
    done = wait_for(job["id"], url, {"cancelled"}, timeout_s=120)
    # A minute on a quiet machine; a slower one gets proportionally longer, as every wait here does.
    assert done["finished_at"] and time.monotonic() - started < 60 * machine_factor()
    ray_jobs = JobSubmissionClient(service["dashboard_url"])
    assert ray_jobs.get_job_status(done["ray_submission_id"]).value == "STOPPED"
    ray_job_id = ray_jobs.get_job_info(done["ray_submission_id"]).job_id
    deadline = time.monotonic() + 60 * machine_factor()
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
