"""Journey: every architecture of the conformance kit fine-tuned through the running service: one family
per model type (its modules, loading, packing decision and saving are the architecture's; the
families that share one differ in tokenizer and template, which tests/training/test_families.py
and tests/integration/test_families_api.py hold to the same rules for every family), chat families on chat records
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

from tests.helpers.paths import MODELS
from tests.helpers.service_api import wait_for

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


def test_every_family_trains_through_the_service_and_its_adapter_loads(service, journey):
    # The jobs went in with the journey's (tests/helpers/payloads.py: one per architecture, chat
    # families on chat records under their own templates, base families on text; DDP).
    url, jobs, full = service["url"], journey.families, journey.jobs["full_fsdp"]["id"]
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
