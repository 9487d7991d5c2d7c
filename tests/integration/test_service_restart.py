"""A restarted service (new app, new store engine, same database) still has every job and
event it acknowledged, on SQLite and on PostgreSQL."""

import json

from fastapi.testclient import TestClient

from eft.service.accounts.auth import KeyStore
from eft.service.settings import get_settings
from eft.service.store.store import Store
from tests.helpers.app import service_app

_KEYS: dict[str, str] = {}
CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def _start(database_url):
    settings = get_settings()
    store = Store(database_url)
    # The key is stored, so the restarted service accepts the one made before the restart.
    if database_url not in _KEYS:
        _KEYS[database_url] = KeyStore(store.engine).create("default", name="restart-test")[1]
    app = service_app(store, settings)
    return store, TestClient(app, headers={"Authorization": f"Bearer {_KEYS[database_url]}"})


def test_jobs_and_events_survive_a_restart(eft_home, database_url):
    (eft_home / "data" / "t.jsonl").write_text(json.dumps(CHAT) + "\n")
    store, client = _start(database_url)
    with client:
        created = [client.post("/jobs", json={"model": "tiny-llama", "training_file": "t.jsonl",
                                              "name": f"job-{i}"}).json() for i in range(3)]
        client.post(f"/jobs/{created[0]['id']}/cancel")
        before = {j["id"]: client.get(f"/jobs/{j['id']}/events").json()["data"] for j in created}
    store.close()

    store, client = _start(database_url)
    with client:
        listed = client.get("/jobs").json()["data"]
        assert [j["id"] for j in listed] == [j["id"] for j in reversed(created)]
        assert {j["name"] for j in listed} == {"job-0", "job-1", "job-2"}
        assert client.get(f"/jobs/{created[0]['id']}").json()["status"] == "cancelled"
        for job_id, events in before.items():
            assert client.get(f"/jobs/{job_id}/events").json()["data"] == events
        assert [e["type"] for e in before[created[0]["id"]]] == ["created", "cancelled"]
    store.close()
