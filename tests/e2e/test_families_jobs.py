"""Every architecture of the conformance kit fine-tuned through the running service: one family
per model type (its modules, loading, packing decision and saving are the architecture's; the
families that share one differ in tokenizer and template, which tests/integration/test_families.py
and test_families_api.py hold to the same rules for every family), chat families on chat records
under their own templates, base families on text; each adapter then loads with plain PEFT in a
fresh process and changes the base model's output (a multimodal checkpoint's adapter covers its
text model only). Plus full fine-tuning under FSDP of a tied-embedding model, whose checkpoint
must save and restore the shared weight."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from eft.training.families import model_name
from eft.training.family_specs import FAMILIES

from tests.e2e.conftest import as_json, client, wait_for

MODELS = Path(__file__).resolve().parents[2] / "assets" / "models"

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


def one_per_architecture() -> list[str]:
    """The first family (by name) of each model type."""
    chosen: dict[str, str] = {}
    for family in sorted(FAMILIES):
        chosen.setdefault(FAMILIES[family]["model_type"], family)
    return sorted(chosen.values())


def _chat(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {i} plus one?"},
                         {"role": "assistant", "content": f"It is {i + 1}."}]}


def test_every_family_trains_through_the_service_and_its_adapter_loads(service):
    url, data = service["url"], service["home"] / "data"
    (data / "families-chat.jsonl").write_text("".join(json.dumps(_chat(i)) + "\n" for i in range(8)))
    (data / "families-text.jsonl").write_text(
        "".join(json.dumps({"text": f"The number {i} comes before {i + 1}."}) + "\n" for i in range(8)))
    # DDP: what is under test is the family (template, masks, modules, tied weights, loading),
    # and one CPU worker under DDP starts without DeepSpeed's imports; the strategies have their
    # own tests, and FSDP is below.
    common = {"hyperparameters": {"max_steps": 2, "global_batch_size": 2, "micro_batch_size": 2,
                                  "max_seq_len": 128, "learning_rate": 1e-2}}
    jobs = {}
    for family in one_per_architecture():
        data_file = "families-chat.jsonl" if FAMILIES[family].get("chat_template") else "families-text.jsonl"
        body = {"model": model_name(family), "training_file": data_file, "strategy": "ddp", **common}
        jobs[family] = as_json(client(url).jobs.create(body))["id"]
    # Full fine-tuning under FSDP of a tied-embedding model: checkpoints hold the shared weight once.
    full = as_json(client(url).jobs.create({
        "model": model_name("qwen2.5"), "training_file": "families-chat.jsonl", "method": {"type": "full"},
        "strategy": "fsdp", "checkpoint": {"every_steps": 1}, **common}))["id"]
    done = {family: wait_for(job_id, url, {"succeeded"}) for family, job_id in jobs.items()}
    for family, job in done.items():
        assert job["step"] == 2, family
        if FAMILIES[family]["model_type"] in ("opt", "bloom"):
            assert job["resolved"]["packing"] is False
    full_done = wait_for(full, url, {"succeeded"})
    assert (Path(full_done["artifact_path"]) / "model.safetensors").is_file()

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
