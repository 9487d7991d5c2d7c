"""The jobs of the e2e journeys: their request bodies, and `submit_all`, which posts every job that
runs undisturbed to its end at once (tests/e2e/conftest.py:journey).

Each job costs a Ray Job, a Ray Train worker group and a model load: a new one is a cost to
justify (tests/budgets.toml); a new check on one of these jobs is free.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx

from eft.service.settings import BUNDLED_ASSETS
from tests.helpers.metrics import RaySeries
from tests.helpers.receiver import Receiver
from tests.helpers.service_api import ADMIN_KEY, as_json, client

#: The job most of the journey is asserted on: 2 workers, checkpoints, evaluation, trackers, and
#: its metrics watched on Ray's endpoint while it runs.
LORA_JOB = {
    "model": "tiny-llama",
    "training_file": "demo/chat_train.jsonl",
    "validation_file": "demo/chat_valid.jsonl",
    "method": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0},
    "hyperparameters": {"max_steps": 12, "learning_rate": 3e-3, "global_batch_size": 16,
                        "micro_batch_size": 4, "max_seq_len": 128, "warmup_steps": 2, "log_every_steps": 1},
    "scaling": {"min_workers": 2},
    "checkpoint": {"every_steps": 5, "keep": 2},
    "name": "e2e-lora",
    "trackers": {"tensorboard": True, "mlflow": True},
}
#: `curl -X POST /jobs -d '{"model": ..., "training_file": ...}'`: defaults do the rest.
MINIMAL_JOB = {"model": "tiny-llama", "training_file": "demo/completion_train.jsonl"}
#: QLoRA (4-bit nf4 base weights) with evaluation every 2 steps; no evaluation after the first
#: lowers the loss by 10, so the job stops after the third (patience 2) and publishes the best
#: step's weights. One worker: QLoRA on two is the training tier's (tests/training/test_strategies.py).
EVAL_QLORA_JOB = {
    "model": "tiny-llama",
    "training_file": "demo/chat_train.jsonl",
    "validation_file": "demo/chat_valid.jsonl",
    "method": {"type": "qlora", "r": 8, "alpha": 16, "dropout": 0.0, "quant_type": "nf4"},
    "hyperparameters": {"max_steps": 40, "learning_rate": 3e-3, "global_batch_size": 8,
                        "micro_batch_size": 4, "max_seq_len": 96, "log_every_steps": 1},
    "scaling": {"min_workers": 1},
    "checkpoint": {"every_steps": 2, "keep": 10},
    "eval": {"every_steps": 2, "early_stopping_patience": 2, "min_delta": 10.0, "sample_prompts": 2,
             "sample_max_tokens": 8},
    "publish": "best",
    "name": "e2e-eval-qlora",
}


@dataclass
class Journey:
    """What `submit_all` posted: the jobs by name as the API answered their creation, the OpenAI
    objects of the jobs made through /v1, and what watches them while they run."""

    url: str
    jobs: dict[str, dict] = field(default_factory=dict)
    openai: dict[str, Any] = field(default_factory=dict)
    series: RaySeries | None = None
    receiver: Receiver | None = None
    webhook: dict | None = None

    def close(self) -> None:
        if self.series is not None:
            self.series.done.set()
        if self.receiver is not None:
            self.receiver.close()


def submit_all(service: dict) -> Journey:
    """Posts every job of the journeys that runs undisturbed to its end, the one watched on Ray's
    endpoint first (its watcher starts with it)."""
    from openai import OpenAI

    url, data = service["url"], service["home"] / "data"
    journey = Journey(url)
    eft = client(url)
    journey.jobs["lora"] = as_json(eft.jobs.create(LORA_JOB))
    journey.series = RaySeries(service["ray_metrics_url"], journey.jobs["lora"]["id"])
    journey.series.start()

    openai = OpenAI(base_url=f"{url}/v1", api_key=ADMIN_KEY, max_retries=0, timeout=60)
    lines = (BUNDLED_ASSETS / "data" / "demo" / "chat_train.jsonl").read_text().splitlines()[:32]
    uploaded = openai.files.create(file=("train.jsonl", ("\n".join(lines) + "\n").encode()), purpose="fine-tune")
    journey.openai["upload"], journey.openai["lines"] = uploaded, lines
    journey.openai["supervised"] = openai.fine_tuning.jobs.create(
        model="tiny-llama", training_file=uploaded.id, suffix="openai-e2e", seed=7, metadata={"team": "e2e"},
        method={"type": "supervised", "supervised": {"hyperparameters": {
            "batch_size": 4, "learning_rate_multiplier": 10, "max_steps": 3, "max_seq_len": 96}}},
    )
    # The DPO job's end is told to a receiver on loopback by the service's webhook sender; the
    # receiver verifies each delivery as it arrives with OpenAI's own SDK.
    journey.receiver = Receiver()
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
    journey.webhook = httpx.post(f"{url}/webhooks", headers=headers, json={
        "url": journey.receiver.url, "events": ["fine_tuning.job.succeeded"]}).raise_for_status().json()
    secret = journey.webhook["secret"] or httpx.post(f"{url}/webhooks/secret", headers=headers).json()["secret"]
    verifier = OpenAI(api_key="unused", webhook_secret=secret)
    journey.receiver.check = lambda headers, body: verifier.webhooks.unwrap(body, headers)
    pairs = (BUNDLED_ASSETS / "data" / "demo" / "preference_train.jsonl").read_text().splitlines()[:32]
    uploaded_pairs = openai.files.create(file=("pairs.jsonl", ("\n".join(pairs) + "\n").encode()), purpose="fine-tune")
    journey.openai["dpo"] = openai.fine_tuning.jobs.create(
        model="tiny-llama", training_file=uploaded_pairs.id, suffix="dpo-e2e",
        method={"type": "dpo", "dpo": {"hyperparameters": {
            "beta": 0.2, "batch_size": 4, "learning_rate_multiplier": 10, "max_steps": 3, "max_seq_len": 96}}},
    )

    journey.jobs["minimal"] = as_json(eft.jobs.create(MINIMAL_JOB))
    journey.jobs["eval_qlora"] = as_json(eft.jobs.create(EVAL_QLORA_JOB))
    # The only record has no room for its answer: none is left to train on.
    (data / "long_prompts.jsonl").write_text(json.dumps({"prompt": "word " * 200, "completion": "answer"}) + "\n")
    journey.jobs["user_error"] = as_json(eft.jobs.create({
        "model": "tiny-llama", "training_file": str(data / "long_prompts.jsonl"), "hyperparameters": {"max_seq_len": 16}}))

    return journey
