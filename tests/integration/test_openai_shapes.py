"""The official `openai` package against the app in process (no Ray): every /v1 call it makes
parses, statuses and fields map from our jobs, and errors come back as its error classes."""

import json

import pytest

pytestmark = pytest.mark.integration
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
