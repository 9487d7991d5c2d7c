"""A succeeded job's `result_files` on /v1: its step metrics as CSV, read with the official
`openai` package; written when first read for a job whose driver did not write it, and by the
job's reporter when it succeeds; another tenant cannot read it."""

from __future__ import annotations

import csv
import io
import json

import pytest

from eft.service.runs.reporter import StoreReporter
from eft.service.settings import get_settings
from eft.service.store.store import Store
from eft.types.jobs import JobStatus
from tests.helpers.app import service_app, tenant_clients


@pytest.fixture
def env(eft_home):
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    app = service_app(store, settings)
    clients = tenant_clients(app, store)
    turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    (eft_home / "data" / "chat.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    with clients["acme"], clients["globex"]:
        yield clients, store, settings


def _openai(client):
    from openai import OpenAI

    key = client.headers["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0)


def _run(store, job_id, reporter=None):
    store.transition(job_id, JobStatus.queued, "validated")
    store.transition(job_id, JobStatus.running, "dispatched", attempt=1)
    for step, values in ((1, {"loss": 2.5, "learning_rate": 1e-3}), (2, {"loss": 2.0, "eval_loss": 2.2}),
                         (3, {"loss": 1.5, "tokens_per_s": 900.0})):
        store.record_metrics(job_id, 1, step, values)
    if reporter is None:
        store.transition(job_id, JobStatus.succeeded, "done", artifact_path="/tmp/x")
    else:
        assert reporter.succeeded("/tmp/x", {"loss": 1.5}, 3)


def test_result_files_hold_the_step_metrics_as_csv(env):
    from openai import NotFoundError

    clients, store, settings = env
    acme = _openai(clients["acme"])
    job = clients["acme"].post("/jobs", json={"model": "tiny-llama", "training_file": "chat.jsonl"}).json()
    assert acme.fine_tuning.jobs.retrieve(job["id"]).result_files == []
    _run(store, job["id"])  # succeeded without a result file written
    (file_id,) = acme.fine_tuning.jobs.retrieve(job["id"]).result_files
    info = acme.files.retrieve(file_id)
    assert info.purpose == "fine-tune-results" and info.filename == f"{job['id']}-step_metrics.csv"
    rows = list(csv.DictReader(io.StringIO(acme.files.content(file_id).text)))
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert [r["train_loss"] for r in rows] == ["2.5", "2.0", "1.5"]
    assert [r["valid_loss"] for r in rows] == ["", "2.2", ""] and rows[0]["learning_rate"] == "0.001"
    with pytest.raises(NotFoundError):
        _openai(clients["globex"]).files.content(file_id)

    # A running job's estimated finish (unix seconds), from its pace so far; none once it ended.
    running = clients["acme"].post("/jobs", json={"model": "tiny-llama", "training_file": "chat.jsonl"}).json()
    store.transition(running["id"], JobStatus.queued, "validated", total_steps=10)
    store.transition(running["id"], JobStatus.running, "dispatched", attempt=1)
    store.update_job(running["id"], attempt=1, step=1)
    store.record_metrics(running["id"], 1, 1, {"loss": 2.0, "step_time_s": 3.0})
    eta = acme.fine_tuning.jobs.retrieve(running["id"]).estimated_finish
    assert eta is not None and eta >= acme.fine_tuning.jobs.retrieve(running["id"]).created_at + 27
    assert acme.fine_tuning.jobs.retrieve(job["id"]).estimated_finish is None

    # The reporter writes it as the job succeeds.
    second = clients["acme"].post("/jobs", json={"model": "tiny-llama", "training_file": "chat.jsonl"}).json()
    _run(store, second["id"], StoreReporter(settings.resolved_database_url, second["id"], 1, store=store))
    listed = {f.id: f for f in acme.files.list(purpose="fine-tune-results").data}
    (second_file,) = acme.fine_tuning.jobs.retrieve(second["id"]).result_files
    assert second_file in listed and file_id in listed
