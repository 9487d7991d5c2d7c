"""Every architecture of the conformance kit fine-tuned as the service runs a job: one family per
model type (its modules, loading, packing decision and saving are the architecture's; the families
that share one differ in tokenizer and template, which tests/training/test_families.py and
tests/integration/test_families_api.py hold to the same rules for every family), chat families on
chat records under their own templates, base families on text; each adapter then loads with plain
PEFT in a fresh process and changes the base model's output (a multimodal checkpoint's adapter
covers its text model only). Plus full fine-tuning under FSDP of a tied-embedding model, whose
checkpoint must save and restore the shared weight.

Each job goes the service's whole way but for the transport: posted to the app (`POST /jobs`),
validated by the scheduler's validation in its helper process, claimed as the dispatcher claims
it, and run by the Ray Job entrypoint's own `run` (service/runs/entrypoint.py) in this process, whose
driver starts a real Ray Train worker group on the tier's shared Ray. What HTTP, Ray Serve and Ray
Jobs add is the same for every architecture; the e2e journeys prove it once
(tests/e2e/test_finished_job.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from eft.service.runs import entrypoint
from eft.service.scheduling.scheduler import ACTIVE
from eft.service.settings import get_settings
from eft.service.store.store import Store
from devkit.families import model_name
from devkit.family_specs import FAMILIES
from eft.types.jobs import JobStatus
from tests.helpers.app import service_app, tenant_client, validate_pending
from tests.helpers.paths import MODELS

LOAD_ADAPTERS = r"""
import json, sys, torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
out = {}
for base_dir, adapter_dir in json.loads(sys.argv[1]):
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        before = base(input_ids=ids).logits
        tuned = PeftModel.from_pretrained(base, adapter_dir)
        after = tuned(input_ids=ids).logits
    adapted = sorted({n.rsplit(".lora_A", 1)[0] for n, _ in tuned.named_modules() if ".lora_A" in n})
    out[adapter_dir] = [type(tuned).__name__, float((after - before).abs().max()), adapted]
print(json.dumps(out))
"""

#: What is under test is the family (template, masks, modules, tied weights, loading): two steps;
#: DDP, because one CPU worker under DDP starts without DeepSpeed's imports.
FAMILY_HYPERPARAMETERS = {"max_steps": 2, "global_batch_size": 2, "micro_batch_size": 2, "max_seq_len": 128,
                          "learning_rate": 1e-2}
#: The full fine-tuning job's name among the families'.
FULL = "full-fsdp-tied"


def one_per_architecture() -> list[str]:
    """The first family (by name) of each model type of the conformance kit."""
    chosen: dict[str, str] = {}
    for family in sorted(FAMILIES):
        chosen.setdefault(FAMILIES[family]["model_type"], family)
    return sorted(chosen.values())


def _chat(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                         {"role": "assistant", "content": f"It is {i + 1}."}]}


@pytest.fixture(scope="module")
def family_jobs(ray_cluster, tmp_path_factory):
    """Every family's job (and the full FSDP one) run to its end, two at a time; their records
    by family once all finished."""
    home = tmp_path_factory.mktemp("eft-home")
    (home / "data").mkdir()
    env = pytest.MonkeyPatch()
    env.setenv("EFT_HOME", str(home))
    env.delenv("EFT_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    (home / "data" / "families-chat.jsonl").write_text("".join(json.dumps(_chat(i)) + "\n" for i in range(8)))
    (home / "data" / "families-text.jsonl").write_text(
        "".join(json.dumps({"text": f"The number {i} comes before {i + 1}."}) + "\n" for i in range(8)))
    bodies = {}
    for family in one_per_architecture():
        data_file = "families-chat.jsonl" if FAMILIES[family].get("chat_template") else "families-text.jsonl"
        bodies[family] = {"model": model_name(family), "training_file": data_file, "strategy": "ddp",
                          "hyperparameters": FAMILY_HYPERPARAMETERS}
    bodies[FULL] = {"model": model_name("qwen2.5"), "training_file": "families-chat.jsonl", "method": {"type": "full"},
                    "strategy": "fsdp", "checkpoint": {"every_steps": 1}, "hyperparameters": FAMILY_HYPERPARAMETERS}
    ids = {}
    api = tenant_client(service_app(store, settings), store)
    with api:
        for name, body in bodies.items():
            created = api.post("/jobs", json=body)
            assert created.status_code == 201, (name, created.text)
            ids[name] = created.json()["id"]
        validate_pending(store, settings)
        for name, job_id in ids.items():
            job = store.get_job(job_id)
            assert job.status is JobStatus.queued, (name, job.status, job.error_message)
            claimed = store.claim(job, submission_id=f"{job_id}-attempt-1", max_running=len(ids), max_per_tenant=len(ids),
                                  active=ACTIVE, message="dispatching attempt 1")
            assert claimed is not None and claimed.attempt == 1, name
        with ThreadPoolExecutor(max_workers=3, thread_name_prefix="family-job") as runner:
            codes = dict(zip(ids, runner.map(lambda job_id: entrypoint.run(job_id, 1), ids.values())))
        assert codes == {name: 0 for name in ids}, codes
        finished = {name: api.get(f"/jobs/{job_id}").json() for name, job_id in ids.items()}
    yield finished
    store.close()
    env.undo()
    get_settings.cache_clear()


def test_every_family_trains_as_a_job_and_its_adapter_loads(family_jobs):
    done = {name: job for name, job in family_jobs.items() if name != FULL}
    assert sorted(done) == one_per_architecture()
    for family, job in done.items():
        assert job["status"] == "succeeded", (family, job["error"])
        assert job["step"] == 2, family
        if FAMILIES[family]["model_type"] in ("opt", "bloom"):
            assert job["resolved"]["packing"] is False, family

    pairs = [(str(MODELS / model_name(f)), job["artifact_path"]) for f, job in done.items()]
    out = subprocess.run([sys.executable, "-c", LOAD_ADAPTERS, json.dumps(pairs)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    for family, job in done.items():
        kind, moved, adapted = loaded[job["artifact_path"]]
        assert kind == "PeftModelForCausalLM" and moved > 0, (family, kind, moved)
        assert adapted, family
        # a multimodal checkpoint trains its text model only: no vision tower, no projector
        assert all(".language_model." in n for n in adapted) or "text_config" not in json.loads(
            (MODELS / model_name(family) / "config.json").read_text()), (family, adapted[:3])
        assert not any("vision" in n or "projector" in n for n in adapted), (family, adapted[:3])


def test_full_fsdp_of_a_tied_embedding_model_saves_the_whole_model(family_jobs):
    job = family_jobs[FULL]
    assert job["status"] == "succeeded", job["error"]
    assert job["step"] == 2 and job["method"]["type"] == "full" and job["strategy"] == "fsdp"
    assert (Path(job["artifact_path"]) / "model.safetensors").is_file()
