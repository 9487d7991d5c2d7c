"""`/v1/models` over the real app and store: the base models on the server by name, and no
fine-tuned id that is not exactly one of the caller's succeeded jobs (the path where a job
trains and its id lists is in tests/e2e/test_openai_job.py)."""

from __future__ import annotations

import json

import pytest

from eft.service.settings import get_settings
from eft.service.store.store import Store
from tests.helpers.app import service_app, tenant_clients


@pytest.fixture
def clients(eft_home):
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    app = service_app(store, settings)
    made = tenant_clients(app, store)
    with made["acme"], made["globex"]:
        yield made
    store.close()


def test_the_base_models_list_by_name_and_retrieve(clients):
    listed = clients["acme"].get("/v1/models")
    assert listed.status_code == 200, listed.text
    body = listed.json()
    ids = [m["id"] for m in body["data"]]
    assert body["object"] == "list" and {"tiny-llama", "tiny-qwen3", "tiny-gemma-2", "tiny-mistral"} <= set(ids)
    assert all(m["object"] == "model" and m["owned_by"] == "system" and m["created"] > 0 for m in body["data"])
    one = clients["acme"].get("/v1/models/tiny-qwen3")
    assert one.status_code == 200 and one.json()["id"] == "tiny-qwen3"


def test_an_id_of_no_succeeded_job_of_the_caller_is_a_404_naming_the_field(clients, eft_home):
    turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    (eft_home / "data" / "chat.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    created = clients["acme"].post("/jobs", json={"model": "tiny-llama", "training_file": "chat.jsonl",
                                                  "name": "bot"})
    assert created.status_code == 201, created.text
    job = created.json()
    assert job["fine_tuned_model"] is None  # named once the job succeeds
    own = f"ft:tiny-llama:bot:{job['id']}"
    for caller, model in [("acme", own), ("acme", f"{own}:ckpt-1"), ("globex", own), ("acme", "ft:a:b:ftjob-none"),
                          ("acme", "not-a-model")]:
        r = clients[caller].get(f"/v1/models/{model}")
        assert r.status_code == 404, (caller, model, r.text)
        assert r.json()["error"]["code"] == "model_not_found" and r.json()["error"]["param"] == "model"
    assert own not in [m["id"] for m in clients["acme"].get("/v1/models").json()["data"]]


def test_the_python_clients_list_and_retrieve_models(clients):
    import asyncio

    import httpx

    from eft import AsyncClient, Client
    from eft._errors import NotFoundError

    http = clients["acme"]
    key = http.headers["Authorization"].removeprefix("Bearer ")
    sync = Client(base_url="http://testserver", api_key=key, http_client=http, max_retries=0)
    assert "tiny-smollm2" in [m.id for m in sync.models.list().data]
    assert sync.models.retrieve("tiny-phi-3").owned_by == "system"
    with pytest.raises(NotFoundError) as missing:
        sync.models.retrieve("ft:tiny-phi-3:x:ftjob-none:ckpt-2")
    assert missing.value.code == "model_not_found"

    async def run():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=http.app)) as raw:
            aclient = AsyncClient(base_url="http://testserver", api_key=key, http_client=raw)
            return (await aclient.models.retrieve("tiny-gemma-3")).id, len((await aclient.models.list()).data)

    name, count = asyncio.run(run())
    assert name == "tiny-gemma-3" and count == len(sync.models.list().data)


def test_eft_models_list_and_get(clients, monkeypatch):
    from typer.testing import CliRunner

    from eft import Client
    from eft.cli import main as cli_module
    from eft.cli import output as cli_output

    http = clients["globex"]
    key = http.headers["Authorization"].removeprefix("Bearer ")
    monkeypatch.setattr(cli_output, "make_client", lambda base_url, api_key: Client(
        base_url="http://testserver", api_key=key, http_client=http, max_retries=0))
    runner = CliRunner()
    listed = runner.invoke(cli_module.app, ["models", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert "tiny-qwen2.5" in [m["id"] for m in json.loads(listed.output)["data"]]
    shown = runner.invoke(cli_module.app, ["models", "get", "tiny-qwen2.5"])
    assert shown.exit_code == 0 and "system" in shown.output
    missing = runner.invoke(cli_module.app, ["models", "get", "ft:tiny-qwen2.5:x:ftjob-none"])
    assert missing.exit_code == 1 and "404 no model" in missing.output
