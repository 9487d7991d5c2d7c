"""The official `openai` package against the app in process (no Ray): every /v1 call it makes
parses, statuses and fields map from our jobs, and errors come back as its error classes."""

import json

import pytest

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.fixture
def openai_client(client):
    from openai import OpenAI

    key = client.headers["Authorization"].removeprefix("Bearer ")
    return OpenAI(base_url="http://testserver/v1", api_key=key, http_client=client, max_retries=0)


def test_files_and_jobs_through_the_openai_package(openai_client):
    from openai import BadRequestError, NotFoundError, UnprocessableEntityError

    f = openai_client.files.create(file=("train.jsonl", (json.dumps(CHAT) + "\n").encode()),
                                   purpose="fine-tune")
    assert openai_client.files.retrieve(f.id).bytes == f.bytes
    assert openai_client.files.content(f.id).read() == (json.dumps(CHAT) + "\n").encode()
    job = openai_client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=f.id, suffix="s1", seed=3, metadata={"k": "v"},
        hyperparameters={"n_epochs": 2, "batch_size": 2, "learning_rate_multiplier": 0.5})
    assert job.status == "validating_files" and job.seed == 3 and job.user_provided_suffix == "s1"
    assert job.hyperparameters.n_epochs == 2 and job.hyperparameters.batch_size == 2
    assert job.hyperparameters.learning_rate_multiplier == 0.5 and job.fine_tuned_model is None
    assert job.method.type == "supervised" and job.organization_id == "org-default"
    again = openai_client.fine_tuning.jobs.retrieve(job.id)
    assert again.id == job.id and again.metadata == {"k": "v"}
    other = openai_client.fine_tuning.jobs.create(
        model="tiny-llama", training_file=f.id,
        method={"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1}}})
    page = openai_client.fine_tuning.jobs.list(limit=1)
    assert [j.id for j in page.data] == [other.id] and page.has_more
    assert [j.id for j in openai_client.fine_tuning.jobs.list(limit=1, after=other.id).data] == [job.id]
    events = openai_client.fine_tuning.jobs.list_events(job.id).data
    assert events and events[0].object == "fine_tuning.job.event"
    assert openai_client.fine_tuning.jobs.checkpoints.list(job.id).data == []
    assert openai_client.fine_tuning.jobs.cancel(job.id).status == "cancelled"
    with pytest.raises(NotFoundError):
        openai_client.fine_tuning.jobs.retrieve("ftjob-missing")
    with pytest.raises(UnprocessableEntityError):
        openai_client.fine_tuning.jobs.create(model="tiny-llama", training_file="file-" + "0" * 24)
    with pytest.raises((BadRequestError, UnprocessableEntityError)):
        openai_client.fine_tuning.jobs.create(model="tiny-llama", training_file=f.id,
                                              hyperparameters={"n_epochs": 500})
    openai_client.fine_tuning.jobs.cancel(other.id)  # an upload a job still uses cannot be deleted
    assert openai_client.files.delete(f.id).deleted


def test_metadata_filter_integrations_pause_and_metrics_events(openai_client, service):
    """The list's `metadata[k]=v` filter (and `metadata=null`), integrations recorded as sent,
    pause and resume, and each logged step as a `metrics` event in OpenAI's shape."""
    from eft.types.jobs import JobStatus

    _, store, _ = service
    f = openai_client.files.create(file=("train.jsonl", (json.dumps(CHAT) + "\n").encode()), purpose="fine-tune")
    wandb = [{"type": "wandb", "wandb": {"project": "tuning", "tags": ["a"]}}]
    team_a = openai_client.fine_tuning.jobs.create(model="tiny-llama", training_file=f.id, metadata={"team": "a"},
                                                   integrations=wandb)
    team_b = openai_client.fine_tuning.jobs.create(model="tiny-llama", training_file=f.id,
                                                   metadata={"team": "b", "run": "2"})
    plain = openai_client.fine_tuning.jobs.create(model="tiny-llama", training_file=f.id)
    assert team_a.integrations[0].type == "wandb" and team_a.integrations[0].wandb.project == "tuning"
    listed = openai_client.fine_tuning.jobs.list(extra_query={"metadata[team]": "b"}).data
    assert [j.id for j in listed] == [team_b.id]
    listed = openai_client.fine_tuning.jobs.list(extra_query={"metadata[team]": "b", "metadata[run]": "3"}).data
    assert listed == []
    assert [j.id for j in openai_client.fine_tuning.jobs.list(extra_query={"metadata": "null"}).data] == [plain.id]
    assert len(openai_client.fine_tuning.jobs.list().data) == 3

    # Pause and resume, as OpenAI's SDK calls them.
    store.transition(team_a.id, JobStatus.queued, "validated")
    assert openai_client.fine_tuning.jobs.pause(team_a.id).status == "paused"
    assert openai_client.fine_tuning.jobs.resume(team_a.id).status == "queued"

    # Steps reported by the workers show as metrics events, newest first with the messages.
    store.transition(team_a.id, JobStatus.running, "dispatched", attempt=1)
    for step, loss in ((1, 2.5), (2, 2.0)):
        store.record_metrics(team_a.id, 1, step, {"loss": loss, "step": step})
    events = openai_client.fine_tuning.jobs.list_events(team_a.id, limit=50).data
    metrics = [e for e in events if e.type == "metrics"]
    assert [(m.data["step"], m.data["train_loss"]) for m in metrics] == [(2, 2.0), (1, 2.5)]
    assert metrics[0].message == "Step 2: training loss=2.0000"
    first = openai_client.fine_tuning.jobs.list_events(team_a.id, limit=2)
    rest = openai_client.fine_tuning.jobs.list_events(team_a.id, limit=50, after=first.data[-1].id)
    assert [e.id for e in first.data + rest.data] == [e.id for e in events]
