"""Idempotent creates and per-tenant quotas over the real app, on SQLite and PostgreSQL:
concurrent retries with one Idempotency-Key make one job, a changed body is a 409, and a create
over a tenant's limit is a 429 with Retry-After (or is queued where the tenant allows it)."""

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from eft.service.accounts.auth import KeyStore
from eft.service.accounts.quotas import set_tenant_limits
from eft.service.settings import get_settings
from eft.service.store.store import Store
from tests.helpers.app import service_app

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.fixture
def service(eft_home, database_url):
    (eft_home / "data" / "t.jsonl").write_text(json.dumps(CHAT) + "\n")
    settings = get_settings()
    store = Store(database_url)
    _, key = KeyStore(store.engine).create("team-a")
    app = service_app(store, settings)
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as client:
        yield client, store
    store.close()


def _job(**extra):
    return {"model": "tiny-llama", "training_file": "t.jsonl", **extra}


def test_concurrent_retries_with_one_key_make_one_job(service):
    client, store = service
    headers = {"Idempotency-Key": "retry-storm-1"}
    # A first create without a key starts the app's model helper (a process importing torch and
    # transformers): the retries below then wait on a create, not on that start.
    warm = client.post("/jobs", json=_job(name="warm-up"))
    assert warm.status_code == 201, warm.text

    def post(_):
        return client.post("/jobs", json=_job(name="once"), headers=headers)

    with ThreadPoolExecutor(max_workers=8) as pool:
        responses = list(pool.map(post, range(8)))
    assert sorted(r.status_code for r in responses) == [200] * 7 + [201], [r.text for r in responses]
    assert len({r.json()["id"] for r in responses}) == 1
    assert {j.name for j in store.list_jobs(limit=100)[0]} == {"warm-up", "once"}
    assert len(store.list_jobs(limit=100)[0]) == 2


def test_same_key_other_body_is_409_and_a_new_key_makes_a_new_job(service):
    client, store = service
    first = client.post("/jobs", json=_job(name="a"), headers={"Idempotency-Key": "k1"})
    assert first.status_code == 201
    # Same body with its keys reordered still matches.
    again = client.post("/jobs", json={"training_file": "t.jsonl", "name": "a", "model": "tiny-llama"},
                        headers={"Idempotency-Key": "k1"})
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    changed = client.post("/jobs", json=_job(name="b"), headers={"Idempotency-Key": "k1"})
    assert changed.status_code == 409
    assert changed.json()["error"]["code"] == "idempotency_key_reused"
    assert client.post("/jobs", json=_job(name="b"), headers={"Idempotency-Key": "k2"}).status_code == 201
    assert len(store.list_jobs(limit=100)[0]) == 2


def test_a_failed_create_releases_its_key(service):
    client, store = service
    bad = client.post("/jobs", json=_job(training_file="missing.jsonl"), headers={"Idempotency-Key": "k3"})
    assert bad.status_code == 422
    fixed = client.post("/jobs", json=_job(training_file="t.jsonl"), headers={"Idempotency-Key": "k3"})
    assert fixed.status_code == 201


def test_over_the_active_job_quota_is_429_with_retry_after(service):
    client, store = service
    set_tenant_limits(store, "team-a", max_active_jobs=2)
    assert [client.post("/jobs", json=_job()).status_code for _ in range(2)] == [201, 201]
    over = client.post("/jobs", json=_job())
    assert over.status_code == 429 and int(over.headers["retry-after"]) > 0
    error = over.json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "quota_exceeded"
    assert len(store.list_jobs(limit=100)[0]) == 2
    # A cancelled job frees its place.
    client.post(f"/jobs/{store.list_jobs(limit=1)[0][0].id}/cancel")
    assert client.post("/jobs", json=_job()).status_code == 201


def test_cpu_and_gpu_quotas_count_the_largest_size(service):
    client, store = service
    set_tenant_limits(store, "team-a", max_cpus=4, max_gpus=0)
    assert client.post("/jobs", json=_job(scaling={"min_workers": 1, "max_workers": 3})).status_code == 201
    over = client.post("/jobs", json=_job(scaling={"min_workers": 2}))
    assert over.status_code == 429 and over.json()["error"]["param"] == "scaling.max_workers"
    gpu = client.post("/jobs", json=_job(scaling={"use_gpu": True}))
    assert gpu.status_code in (422, 429)  # no GPU on this machine may be refused first


def test_a_tenant_that_allows_queueing_is_accepted_over_its_limit(service):
    client, store = service
    set_tenant_limits(store, "team-a", max_active_jobs=1, queue_over_quota=True)
    assert [client.post("/jobs", json=_job()).status_code for _ in range(3)] == [201, 201, 201]


def test_twenty_concurrent_creates_pass_a_limit_of_two_exactly_twice(service):
    """The quota is checked in the create's own serialized transaction: of 20 creates racing
    on one tenant (distinct keys, 20 threads), exactly 2 are stored and 18 answer 429."""
    client, store = service
    set_tenant_limits(store, "team-a", max_active_jobs=2)
    barrier = __import__("threading").Barrier(20)

    def post(i):
        barrier.wait()
        return client.post("/jobs", json=_job(name=f"race-{i}"), headers={"Idempotency-Key": f"race-{i}"})

    with ThreadPoolExecutor(max_workers=20) as pool:
        codes = sorted(r.status_code for r in pool.map(post, range(20)))
    assert codes == [201] * 2 + [429] * 18, codes
    assert len(store.list_jobs(limit=100)[0]) == 2


def test_a_slow_request_keeps_its_idempotency_claim(eft_home, monkeypatch):
    """A create that takes longer than the abandon time renews its claim while it runs: a
    repeat with the same key waits for it and gets its job, instead of creating a second."""
    import threading

    from eft.service.accounts import idempotency
    from eft.service.settings import get_settings

    monkeypatch.setattr(idempotency, "ABANDONED_AFTER_S", 0.5)
    monkeypatch.setattr(idempotency, "HEARTBEAT_S", 0.05)
    store = Store(get_settings().resolved_database_url)
    keys = idempotency.Idempotency(store.engine, wait_s=30)
    release, made = threading.Event(), []

    def slow_create():
        release.wait(timeout=30)  # slower than ABANDONED_AFTER_S
        made.append("job-1")
        return "job-1"

    first = threading.Thread(target=lambda: made.append(keys.run("t", "k", "POST /jobs", "d", slow_create)))
    first.start()
    while keys._row("t", "k") is None:
        pass  # the first request has claimed the key
    repeat: list = []
    second = threading.Thread(target=lambda: repeat.append(
        keys.run("t", "k", "POST /jobs", "d", lambda: made.append("job-2") or "job-2")))
    second.start()
    second.join(timeout=1.5)  # three abandon times pass while the first request still runs
    assert second.is_alive(), f"the repeat did not wait: {repeat}"
    release.set()
    first.join(timeout=30)
    second.join(timeout=30)
    assert repeat == [("job-1", False)] and "job-2" not in made
    store.close()
