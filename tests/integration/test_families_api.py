"""Real model families through the service's request path and validation: a template that
refuses the data is a 422 naming the line and the fix when the request can know it, a
`user_error.*` naming the record after validation otherwise, and never holds up another
tenant's job; records with no trained token are left out and counted."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from eft.service.accounts.auth import KeyStore
from eft.service.runs.launcher import RayJobsLauncher
from eft.service.scheduling.scheduler import Scheduler
from eft.service.settings import get_settings
from eft.service.store.store import Store
from eft.service.requests.prepare import validate_job
from eft.service.requests.templates import TEMPLATE_SAMPLE
from devkit.families import model_name
from devkit.family_specs import FAMILIES
from eft.types.jobs import JobStatus
from tests.helpers.app import service_app, validate_pending


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def chat(i: int, system: bool = False) -> dict:
    turns = [{"role": "user", "content": f"What is {i} plus one?"},
             {"role": "assistant", "content": f"It is {i + 1}."}]
    return {"messages": ([SYSTEM] if system else []) + turns}


@pytest.fixture
def service(eft_home):
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    app = service_app(store, settings)
    keys = KeyStore(store.engine)
    clients = {}
    for tenant in ("acme", "globex"):
        _, key = keys.create(tenant, "user", name="tests")
        clients[tenant] = TestClient(app, headers={"Authorization": f"Bearer {key}"})
    with clients["acme"], clients["globex"]:
        yield clients, store, settings
    store.close()


def write(eft_home, name: str, records: list[dict]) -> str:
    (eft_home / "data" / name).write_text("".join(json.dumps(r) + "\n" for r in records))
    return name


def test_a_template_without_system_role_is_a_422_naming_the_line_and_the_fix(service, eft_home):
    clients, _, _ = service
    data = write(eft_home, "sys.jsonl", [chat(1), chat(2, system=True)])
    r = clients["acme"].post("/jobs", json={"model": "tiny-gemma-2", "training_file": data})
    assert r.status_code == 422, r.text
    problem = r.json()["error"]["errors"][0]
    assert problem["param"] == "training_file:line 2:messages"
    assert problem["code"] == "chat_template_refused"
    assert "System role not supported" in problem["message"] and "system_message to 'fold'" in problem["message"]
    # The fix the message names works.
    r = clients["acme"].post("/jobs", json={"model": "tiny-gemma-2", "training_file": data,
                                            "data": {"system_message": "fold"}})
    assert r.status_code == 201, r.text


def test_a_file_rewritten_in_place_is_checked_again(service, eft_home):
    """The template check is remembered per file version: the same file passes once, and
    rewritten with a record the template refuses (same name, new content) it is a 422."""
    clients, _, _ = service
    data = write(eft_home, "rewritten.jsonl", [chat(1), chat(2)])
    for _ in range(2):  # the second create is answered from the remembered check
        r = clients["acme"].post("/jobs", json={"model": "tiny-gemma-2", "training_file": data})
        assert r.status_code == 201, r.text
    write(eft_home, "rewritten.jsonl", [chat(1), chat(2, system=True), chat(3)])
    r = clients["acme"].post("/jobs", json={"model": "tiny-gemma-2", "training_file": data})
    assert r.status_code == 422, r.text
    assert r.json()["error"]["errors"][0]["code"] == "chat_template_refused"


def test_chat_data_for_a_model_without_chat_template_is_a_422(service, eft_home):
    clients, _, _ = service
    data = write(eft_home, "chat.jsonl", [chat(1)])
    r = clients["acme"].post("/jobs", json={"model": "tiny-gpt2", "training_file": data})
    assert r.status_code == 422
    problem = r.json()["error"]["errors"][0]
    assert problem["code"] == "chat_no_chat_template" and "prompt/completion" in problem["message"]


def test_a_refusal_found_in_validation_fails_that_job_only(service, eft_home):
    """Tenant acme's record past the request's sample breaks Gemma 2's template: its job fails
    at validation naming the line, and globex's job, created after it, is queued in the same
    pass."""
    clients, store, settings = service
    late = TEMPLATE_SAMPLE + 8
    records = [chat(i, system=(i == late - 1)) for i in range(late + 4)]
    bad = write(eft_home, "late.jsonl", records)
    good = write(eft_home, "good.jsonl", [chat(i) for i in range(20)])
    a = clients["acme"].post("/jobs", json={"model": "tiny-gemma-2", "training_file": bad})
    b = clients["globex"].post("/jobs", json={"model": "tiny-qwen2.5", "training_file": good})
    assert a.status_code == b.status_code == 201, (a.text, b.text)
    scheduler = Scheduler(store, RayJobsLauncher(settings), settings.model_copy(update={"dispatch_paused": True}),
                          validate_job)
    scheduler.validate_pending()
    failed, queued = store.get_job(a.json()["id"]), store.get_job(b.json()["id"])
    assert failed.status.value == "failed" and queued.status.value == "queued"
    assert failed.error_code == "user_error.template_refused"
    assert f"line {late}" in failed.error_message and "system_message to 'fold'" in failed.error_message


def test_a_crash_in_one_validation_never_stops_the_others(service, eft_home):
    clients, store, settings = service
    good = write(eft_home, "good.jsonl", [chat(i) for i in range(10)])
    ids = [clients[t].post("/jobs", json={"model": "tiny-llama-3.1", "training_file": good}).json()["id"]
           for t in ("acme", "globex")]

    def validate(job, s):
        if job.id == ids[0]:
            raise RuntimeError("disk went away")
        return validate_job(job, s)

    scheduler = Scheduler(store, RayJobsLauncher(settings), settings.model_copy(update={"dispatch_paused": True}),
                          validate)
    scheduler.validate_pending()
    assert store.get_job(ids[1]).status.value == "queued"
    assert store.get_job(ids[0]).status.value == "validating"  # retried on the next passes
    scheduler.validate_pending()
    scheduler.validate_pending()
    crashed = store.get_job(ids[0])
    assert crashed.status.value == "failed" and crashed.error_code == "platform_error.validation_failed"
    assert "disk went away" in crashed.error_message


def test_records_without_room_for_the_answer_are_left_out_and_counted(service, eft_home):
    clients, store, settings = service
    long = {"prompt": "word " * 300, "completion": " end"}
    pairs = [{"prompt": f"Say {i}", "completion": f" {i}"} for i in range(29)]
    some = write(eft_home, "some.jsonl", pairs + [long])
    most = write(eft_home, "most.jsonl", pairs[:5] + [long] * 5)
    body = {"model": "tiny-qwen3", "hyperparameters": {"max_seq_len": 64}}
    ok = clients["acme"].post("/jobs", json={**body, "training_file": some}).json()["id"]
    refused = clients["acme"].post("/jobs", json={**body, "training_file": most}).json()["id"]
    validate_pending(store, settings)
    job = store.get_job(ok)
    assert job.status.value == "queued" and job.config["num_train_examples"] == 29
    validated = [e for e in store.list_events(ok)[0] if e.type == "queued"][0]
    assert validated.data["dropped_examples"] == 1 and validated.data["dropped_lines"] == [30]
    assert "1 left out" in validated.message
    job = store.get_job(refused)
    assert job.status.value == "failed" and job.error_code == "user_error.too_many_dropped"
    assert "5 of 10" in job.error_message and "max_dropped_fraction" in job.error_message


def _plan(clients, body):
    r = clients["acme"].post("/jobs", json=body)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.fixture
def chat_file(eft_home):
    return write(eft_home, "chat.jsonl", [chat(i) for i in range(8)])


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_familys_data_is_validated_and_planned_by_the_service(family, service, chat_file, eft_home):
    """What a job of each family goes through before it trains (the e2e test trains one family per
    architecture): the request's checks, the plan, and validation tokenising its records under
    its own template (chat) or as text, every record kept."""
    clients, store, settings = service
    chat_model = bool(FAMILIES[family].get("chat_template"))
    data = chat_file if chat_model else write(eft_home, "text.jsonl", [{"text": f"{i} comes before {i + 1}."}
                                                                      for i in range(8)])
    job = _plan(clients, {"model": model_name(family), "training_file": data})
    validate_pending(store, settings)
    done = store.get_job(job["id"])
    assert done.status is JobStatus.queued, (done.status, done.error_message)
    assert done.config["num_train_examples"] == 8 and done.plan["predicted_memory_gb"] > 0
    assert done.config["lora"]["target_modules"]


def test_attention_kernel_is_chosen_per_architecture(service, chat_file):
    clients, store, _ = service
    gemma = _plan(clients, {"model": "tiny-gemma-2", "training_file": chat_file})
    llama = _plan(clients, {"model": "tiny-llama-3.1", "training_file": chat_file})
    assert store.get_job(gemma["id"]).plan["attention"] == "eager"  # Gemma 2 refuses SDPA
    assert store.get_job(llama["id"]).plan["attention"] == "sdpa"
    r = clients["acme"].post("/jobs", json={"model": "tiny-gemma-2", "training_file": chat_file,
                                            "optimizations": {"attention": "sdpa"}})
    problem = r.json()["error"]["errors"][0]
    assert r.status_code == 422 and problem["code"] == "attention_unsupported" and "eager" in problem["message"]


def test_packing_is_left_off_where_it_would_not_be_exact(service, eft_home):
    clients, store, _ = service
    text = write(eft_home, "text.jsonl", [{"text": f"The number {i} comes after {i - 1}."} for i in range(8)])
    opt = _plan(clients, {"model": "tiny-opt", "training_file": text})
    neox = _plan(clients, {"model": "tiny-pythia", "training_file": text})
    assert store.get_job(opt["id"]).plan["packing"] is False and store.get_job(neox["id"]).plan["packing"] is True
    r = clients["acme"].post("/jobs", json={"model": "tiny-bloom", "training_file": text,
                                            "optimizations": {"packing": True}})
    assert r.status_code == 422 and r.json()["error"]["errors"][0]["code"] == "packing_inexact"


def test_lora_targets_are_the_models_own_module_names(service, chat_file, eft_home):
    clients, store, settings = service
    _plan(clients, {"model": "tiny-phi-3", "training_file": chat_file,
                    "method": {"type": "lora", "target_modules": ["qkv_proj", "gate_up_proj"]}})
    text = write(eft_home, "text.jsonl", [{"text": "a b c"}] * 4)
    _plan(clients, {"model": "tiny-gpt2", "training_file": text,
                    "method": {"type": "lora", "target_modules": ["c_attn"]}})
    r = clients["acme"].post("/jobs", json={"model": "tiny-phi-3", "training_file": chat_file,
                                            "method": {"type": "lora", "target_modules": ["q_proj", "v_proj"]}})
    problem = r.json()["error"]["errors"][0]
    assert r.status_code == 422 and problem["param"] == "method.target_modules"
    assert "q_proj, v_proj" in problem["message"] and "qkv_proj" in problem["message"]
    # A preset resolves to the model's names when the job is validated.
    job = _plan(clients, {"model": "tiny-phi-3", "training_file": chat_file,
                          "method": {"type": "lora", "target_modules": "attention"}})
    validate_pending(store, settings)
    assert sorted(store.get_job(job["id"]).config["lora"]["target_modules"]) == ["o_proj", "qkv_proj"]


def test_remote_code_and_unknown_architectures_are_refused_clearly(service, chat_file, eft_home):
    clients, _, _ = service
    model = eft_home / "models" / "custom"
    model.mkdir(parents=True)
    (model / "config.json").write_text(json.dumps({
        "model_type": "my_custom_lm", "auto_map": {"AutoModelForCausalLM": "modeling_custom.CustomLM"},
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100}))
    r = clients["acme"].post("/jobs", json={"model": str(model), "training_file": chat_file})
    problem = r.json()["error"]["errors"][0]
    assert r.status_code == 422 and problem["code"] == "architecture_unsupported"
    assert "trust_remote_code" in problem["message"]


def test_a_multimodal_checkpoint_is_planned_from_its_text_config(service, chat_file, eft_home):
    """Gemma 3 4B and up ship a multimodal config whose numbers sit in `text_config`."""
    from transformers import Gemma3Config

    clients, store, _ = service
    model = eft_home / "models" / "gemma3-mm-config"
    model.mkdir(parents=True)
    Gemma3Config(
        text_config={"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                     "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 1024},
        vision_config={"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
                       "num_attention_heads": 2, "image_size": 32, "patch_size": 8},
        mm_tokens_per_image=4, architectures=["Gemma3ForConditionalGeneration"],
    ).save_pretrained(model)
    r = clients["acme"].post("/plan", json={"model": str(model), "method": {"type": "lora"},
                                             "cluster": {"gpus": 1, "gpu_memory_gb": 24}})
    assert r.status_code == 200, r.text
    # LoRA r=8 on every linear of the two text layers, as the model itself has them.
    per_layer = 8 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 128) + (128 + 64))
    assert r.json()["model"]["trainable_parameters"] == 2 * per_layer
