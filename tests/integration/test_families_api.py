"""Real model families through the service's request path and validation: a template that
refuses the data is a 422 naming the line and the fix when the request can know it, a
`user_error.*` naming the record after validation otherwise, and never holds up another
tenant's job; records with no trained token are left out and counted."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from eft.api.app import create_app
from eft.service.auth import KeyStore
from eft.service.jobs import JobService
from eft.service.launcher import RayJobsLauncher
from eft.service.scheduler import Scheduler
from eft.service.settings import get_settings
from eft.service.store import Store
from eft.service.validation import TEMPLATE_SAMPLE, validate_job

pytestmark = pytest.mark.integration

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}


def chat(i: int, system: bool = False) -> dict:
    turns = [{"role": "user", "content": f"What is {i} plus one?"},
             {"role": "assistant", "content": f"It is {i + 1}."}]
    return {"messages": ([SYSTEM] if system else []) + turns}


@pytest.fixture
def service(eft_home):
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    app = create_app(JobService(store, RayJobsLauncher(settings), settings))
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
    Scheduler(store, RayJobsLauncher(settings), settings.model_copy(update={"dispatch_paused": True}),
              validate_job).validate_pending()
    job = store.get_job(ok)
    assert job.status.value == "queued" and job.config["num_train_examples"] == 29
    validated = [e for e in store.list_events(ok)[0] if e.type == "queued"][0]
    assert validated.data["dropped_examples"] == 1 and validated.data["dropped_lines"] == [30]
    assert "1 left out" in validated.message
    job = store.get_job(refused)
    assert job.status.value == "failed" and job.error_code == "user_error.too_many_dropped"
    assert "5 of 10" in job.error_message and "max_dropped_fraction" in job.error_message
