"""Webhooks through the real app and store, to a real HTTP receiver on loopback: each terminal
(and paused) event delivered once per attempt with OpenAI's body and Standard Webhooks headers,
verified by OpenAI's own SDK; a receiver that fails twice gets it on the third try; retries stop
after the configured day; URLs the server must not call are refused. The sender is stepped with
an explicit clock instead of waiting out its backoff."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from tests.helpers.receiver import Receiver

from eft.service.webhooks import WebhookSender, url_problem
from eft.types.jobs import JobStatus


@pytest.fixture
def loopback_allowed(monkeypatch):
    monkeypatch.setenv("EFT_WEBHOOK_ALLOW_LOOPBACK", "true")
    monkeypatch.setenv("EFT_WEBHOOK_RETRY_BASE_S", "10")
    monkeypatch.setenv("EFT_WEBHOOK_RETRY_FOR_S", "3600")


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def setup(loopback_allowed, service, eft_home, receiver):
    client, store, settings = service
    turns = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    (eft_home / "data" / "train.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    sender = WebhookSender(store.engine, settings)
    yield client, store, settings, sender
    sender.client.close()


def _job(client, **extra):
    created = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl", **extra})
    assert created.status_code == 201, created.text
    return created.json()["id"]


def _verify(secret, headers, body):
    """OpenAI's SDK checks the signature and the timestamp, and parses the event."""
    from openai import OpenAI

    openai = OpenAI(api_key="unused", webhook_secret=secret)
    openai.webhooks.verify_signature(body, headers)  # raises InvalidWebhookSignatureError
    return openai.webhooks.unwrap(body, headers)


def test_terminal_events_are_signed_and_delivered_once(setup, receiver):
    client, store, _, sender = setup
    missing = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl",
                                         "webhook_url": receiver.url})
    assert missing.status_code == 422
    assert missing.json()["error"]["errors"][0]["code"] == "webhook_secret_missing"
    secret = client.post("/webhooks/secret").json()["secret"]
    assert secret.startswith("whsec_")
    job = _job(client, webhook_url=receiver.url)
    assert client.get(f"/jobs/{job}").json()["webhook_url"] == receiver.url
    store.transition(job, JobStatus.queued, "validated")
    store.transition(job, JobStatus.running, "dispatched", attempt=1)
    assert sender.send_due() == 0  # nothing owed for a job that is only running
    store.transition(job, JobStatus.succeeded, "done", artifact_path="/tmp/a")
    assert sender.send_due() == 1
    assert sender.send_due() == 0 and len(receiver.requests) == 1  # delivered once
    headers, body = receiver.requests[0]
    event = _verify(secret, headers, body)
    assert event.type == "fine_tuning.job.succeeded" and event.data.id == job
    assert headers["webhook-id"] == event.id and headers["content-type"] == "application/json"
    deliveries = client.get(f"/jobs/{job}/webhooks").json()["data"]
    assert [(d["type"], d["status"], [a["status_code"] for a in d["attempts"]]) for d in deliveries] == [
        ("fine_tuning.job.succeeded", "delivered", [200])]
    # A forged or stale signature does not verify.
    from openai import InvalidWebhookSignatureError

    with pytest.raises(InvalidWebhookSignatureError):
        _verify(secret, headers, body.replace(job.encode(), b"ftjob-forged"))
    # Each terminal event, and a pause, once per job.
    for target in (JobStatus.failed, JobStatus.cancelled, JobStatus.paused):
        other = _job(client, webhook_url=receiver.url)
        store.transition(other, JobStatus.queued, "validated")
        store.transition(other, target, "done")
        assert sender.send_due() == 1
        event = _verify(secret, *receiver.requests[-1])
        assert event.type == f"fine_tuning.job.{target.value}" and event.data.id == other
    assert len(receiver.requests) == 4


def test_a_receiver_that_fails_twice_gets_it_on_the_third_try(setup, receiver):
    client, store, settings, sender = setup
    created = client.post("/webhooks", json={"url": receiver.url})
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]  # the tenant's first endpoint made the secret: shown once
    assert secret and client.get("/webhooks").json()["data"][0].get("secret") is None
    receiver.codes = [500, 503]
    job = _job(client)
    store.transition(job, JobStatus.queued, "validated")
    store.transition(job, JobStatus.paused, "paused before it ran")
    start = store.get_job(job).updated_at
    assert sender.send_due(start) == 1  # answered 500
    assert sender.send_due(start + timedelta(seconds=9)) == 0  # not due before the backoff (10 s)
    assert sender.send_due(start + timedelta(seconds=10)) == 1  # answered 503
    assert sender.send_due(start + timedelta(seconds=29)) == 0  # the backoff doubled: 20 s
    assert sender.send_due(start + timedelta(seconds=30)) == 1  # delivered
    assert sender.send_due(start + timedelta(seconds=3000)) == 0
    assert len(receiver.requests) == 3
    for headers, body in receiver.requests:  # each attempt signed afresh (its own timestamp)
        assert _verify(secret, headers, body).type == "fine_tuning.job.paused"
    ids = {h["webhook-id"] for h, _ in receiver.requests}
    assert len(ids) == 1  # one event, retried under its own id (receivers deduplicate on it)
    (delivery,) = client.get(f"/jobs/{job}/webhooks").json()["data"]
    assert delivery["status"] == "delivered" and delivery["type"] == "fine_tuning.job.paused"
    assert [(a["attempt"], a["status_code"]) for a in delivery["attempts"]] == [(1, 500), (2, 503), (3, 200)]
    assert delivery["attempts"][0]["error"] == "answered 500"


def test_retries_stop_after_the_retry_window_and_replicas_never_double_send(setup, receiver):
    client, store, settings, sender = setup
    client.post("/webhooks", json={"url": receiver.url, "events": ["fine_tuning.job.failed"]})
    receiver.codes = [500] * 100
    cancelled, failed = _job(client), _job(client)
    for job, target in ((cancelled, JobStatus.cancelled), (failed, JobStatus.failed)):
        store.transition(job, JobStatus.queued, "validated")
        store.transition(job, target, "done")
    assert client.get(f"/jobs/{cancelled}/webhooks").json()["data"] == []  # not an event it asked for
    start = store.get_job(failed).updated_at
    other_replica = WebhookSender(store.engine, settings)
    assert sender.send_due(start) == 1 and other_replica.send_due(start) == 0  # claimed by the first
    other_replica.client.close()
    moment, made = start, 1
    while made < 20:
        moment += timedelta(seconds=sender.backoff(made))
        if not sender.send_due(moment):
            break
        made += 1
    (delivery,) = client.get(f"/jobs/{failed}/webhooks").json()["data"]
    assert delivery["status"] == "failed" and delivery["next_attempt_at"] is None
    assert len(delivery["attempts"]) == made == len(receiver.requests)
    # Each attempt waited twice as long as the one before (10, 20, 40, ... s) while the next one
    # still fell within the hour's window: attempts at 0, 10, 30, ..., 2550 s.
    assert made == 9


def test_webhook_urls_the_server_must_not_call_are_refused(setup):
    client, *_ = setup
    client.post("/webhooks/secret")
    for url, words in (("https://10.1.2.3/hook", "private"), ("http://8.8.8.8/hook", "https"),
                       ("https://169.254.169.254/latest", "private"), ("ftp://example.org/x", "https")):
        refused = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl",
                                             "webhook_url": url})
        assert refused.status_code == 422, url
        error = refused.json()["error"]["errors"][0]
        assert error["param"] == "webhook_url" and error["code"] == "webhook_url_refused" and words in error["message"]
        endpoint = client.post("/webhooks", json={"url": url})
        assert endpoint.status_code == 422 and endpoint.json()["error"]["errors"][0]["param"] == "url"
    assert client.delete("/webhooks/whep_nope").status_code == 404


def test_url_policy():
    assert url_problem("https://8.8.8.8/x", False, False) is None
    assert "https" in url_problem("http://127.0.0.1:9/x", allow_loopback=False, allow_private=False)
    assert url_problem("http://127.0.0.1:9/x", allow_loopback=True, allow_private=False) is None
    assert "private" in url_problem("https://192.168.1.10/x", False, False)
    assert url_problem("https://192.168.1.10/x", False, allow_private=True) is None
    assert "credentials" in url_problem("https://user:pw@8.8.8.8/x", False, False)


def test_an_admin_keys_webhooks_are_its_own_tenants(setup, receiver):
    """An admin key sees every tenant's jobs, but its webhooks and secret are its own tenant's."""
    from eft.service.auth import KeyStore

    client, store, *_ = setup
    _, key = KeyStore(store.engine).create("ops", "admin", name="admin")
    headers = {"Authorization": f"Bearer {key}"}
    created = client.post("/webhooks", json={"url": receiver.url}, headers=headers)
    assert created.status_code == 201, created.text
    assert created.json()["secret"].startswith("whsec_")
    assert [e["url"] for e in client.get("/webhooks", headers=headers).json()["data"]] == [receiver.url]
    assert client.get("/webhooks").json()["data"] == []  # not the default tenant's
    assert client.post("/webhooks/secret", headers=headers).json()["secret"].startswith("whsec_")
