"""Evaluation during training, through the service: the validation loss every few steps (the
eval curve in the job's metrics), replies to validation prompts at each evaluation, early
stopping with a patience, the best checkpoint marked, and the best step's weights published."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eft.training.checkpoint import load_trainable
from tests.e2e.conftest import as_json, client, wait_for

pytestmark = pytest.mark.e2e

JOB = {
    "model": "tiny-llama",
    "training_file": "demo/chat_train.jsonl",
    "validation_file": "demo/chat_valid.jsonl",
    "method": {"type": "lora", "r": 4, "alpha": 8, "dropout": 0.0},
    "hyperparameters": {"max_steps": 40, "learning_rate": 3e-3, "global_batch_size": 8,
                        "micro_batch_size": 4, "max_seq_len": 96, "log_every_steps": 5},
    "scaling": {"min_workers": 1},
    "checkpoint": {"every_steps": 2, "keep": 10},
    # No evaluation after the first lowers the loss by 10: the job stops after the third.
    "eval": {"every_steps": 2, "early_stopping_patience": 2, "min_delta": 10.0, "sample_prompts": 2,
             "sample_max_tokens": 8},
    "publish": "best",
    "name": "e2e-eval",
}


def test_eval_curve_samples_early_stop_and_the_best_step_published(service):
    url = service["url"]
    eft = client(url)
    job = as_json(eft.jobs.create(JOB))
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
