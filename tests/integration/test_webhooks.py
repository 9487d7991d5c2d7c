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

from eft.service.webhooks.sender import WebhookSender
from eft.service.webhooks.rules import url_problem
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
    sender.close()


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
    other_replica.close()
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
    # Every way back to a private or loopback address is refused (before, the shared address
    # space, 6to4, NAT64 and IPv4-mapped loopback passed).
    for url in ("https://100.64.1.1/x", "https://[2002:7f00:1::]/x", "https://[64:ff9b::7f00:1]/x",
                "https://[::ffff:127.0.0.1]/x", "https://[2002:a00:1::]/x", "https://0.0.0.0/x",
                "https://224.0.0.1/x", "https://[fe80::1]/x", "https://[fc00::1]/x"):
        assert "non-public" in (url_problem(url, False, False) or ""), url
    assert url_problem("https://[2606:4700::1111]/x", False, False) is None
    assert url_problem("https://[2002:808:808::]/x", False, False) is None  # 6to4 of 8.8.8.8


def test_a_host_that_resolves_slowly_holds_no_request_past_the_dns_timeout(setup, monkeypatch):
    """Before: the URL's host was resolved on the API thread with no time limit of its own (a
    name whose DNS answered after minutes held a thread of the replica that long)."""
    import socket
    import threading
    import time

    client, *_ = setup
    release = threading.Event()
    real = socket.getaddrinfo

    def slow(host, *args, **kwargs):
        if host == "slow.example":
            release.wait(30)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", slow)
    try:
        started = time.monotonic()
        refused = client.post("/webhooks", json={"url": "https://slow.example/hook"})
        took = time.monotonic() - started
        assert refused.status_code == 422, refused.text
        assert "did not resolve within 2 s" in refused.json()["error"]["errors"][0]["message"]
        assert took < 2 + 3, took
    finally:
        release.set()


def test_the_sender_reports_its_health():
    from types import SimpleNamespace

    settings = SimpleNamespace(webhook_concurrency=1, webhook_poll_interval_s=1.0)
    sender = WebhookSender(None, settings)
    assert sender.healthy()
    sender.last_pass -= 600  # no pass for ten minutes: the replica's health check fails
    assert not sender.healthy()
    sender.close()


def test_an_admin_keys_webhooks_are_its_own_tenants(setup, receiver):
    """An admin key sees every tenant's jobs, but its webhooks and secret are its own tenant's."""
    from eft.service.accounts.auth import KeyStore

    client, store, *_ = setup
    _, key = KeyStore(store.engine).create("ops", "admin", name="admin")
    headers = {"Authorization": f"Bearer {key}"}
    created = client.post("/webhooks", json={"url": receiver.url}, headers=headers)
    assert created.status_code == 201, created.text
    assert created.json()["secret"].startswith("whsec_")
    assert [e["url"] for e in client.get("/webhooks", headers=headers).json()["data"]] == [receiver.url]
    assert client.get("/webhooks").json()["data"] == []  # not the default tenant's
    assert client.post("/webhooks/secret", headers=headers).json()["secret"].startswith("whsec_")


# --- a sender no receiver can hold ------------------------------------------------------------


class _Listener:
    """A TCP server on loopback that hands each connection to `serve(conn)` in a thread of its
    own, and counts the connections it got."""

    def __init__(self, serve=None):
        import socket
        import threading

        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.serve = serve or (lambda conn: conn.close())
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        import threading

        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        try:
            self.serve(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.closed.set()
        self.sock.close()


def _read_request(conn):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    return data


def _paused_job(client, store):
    job = _job(client)
    store.transition(job, JobStatus.queued, "validated")
    store.transition(job, JobStatus.paused, "paused")
    return job


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setenv("EFT_WEBHOOK_TIMEOUT_S", "1")


def test_a_receiver_dripping_its_answer_holds_an_attempt_no_longer_than_the_deadline(quick, setup):
    """Before: each read had the timeout, so headers sent a byte every 0.2 s held the attempt
    (and every tenant's deliveries behind it) as long as the receiver liked."""
    import threading

    client, store, settings, sender = setup
    done = threading.Event()

    def drip(conn):
        _read_request(conn)
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 40 + b"\r\nContent-Length: 0\r\n\r\n":
            if done.wait(0.2):
                return
            conn.sendall(bytes([byte]))

    listener = _Listener(drip)
    try:
        client.post("/webhooks", json={"url": f"http://127.0.0.1:{listener.port}/hook"})
        job = _paused_job(client, store)
        assert sender.send_due() == 1
        (delivery,) = client.get(f"/jobs/{job}/webhooks").json()["data"]
        (attempt,) = delivery["attempts"]
        assert attempt["seconds"] < settings.webhook_timeout_s + 0.5, attempt  # the drip needs ~13 s
        assert attempt["status_code"] is None and attempt["error"].startswith("not delivered")
        assert delivery["status"] == "pending"  # retried later, as any failure
    finally:
        done.set()
        listener.close()


def test_a_huge_answer_is_never_read(setup):
    """Before: the whole answer was read into the replica's memory (300 MB took it from 157 to
    758 MB); now only its status line and headers are."""
    import resource

    client, store, settings, sender = setup
    size = 400 * 2**20
    sent = []

    def huge(conn):
        _read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % size)
        chunk, total = b"x" * 2**20, 0
        while total < size:
            conn.sendall(chunk)  # fails once the sender closes the connection
            total += len(chunk)
            sent.append(total)

    listener = _Listener(huge)
    try:
        client.post("/webhooks", json={"url": f"http://127.0.0.1:{listener.port}/hook"})
        job = _paused_job(client, store)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        assert sender.send_due() == 1
        grew_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        (delivery,) = client.get(f"/jobs/{job}/webhooks").json()["data"]
        assert delivery["status"] == "delivered" and delivery["attempts"][0]["status_code"] == 200
        assert grew_mb < 100, grew_mb
        assert not sent or sent[-1] < size  # the receiver could not push it all
    finally:
        listener.close()


def test_the_address_checked_is_the_address_sent_to(setup, monkeypatch):
    """DNS rebinding: a name that resolves to a public address when checked and to loopback
    the next time. Before, the check and the send each resolved it, and the delivery reached
    127.0.0.1; now the attempt connects to the address it checked."""
    import socket

    client, store, settings, sender = setup
    listener = _Listener()
    real = socket.getaddrinfo
    asked = []

    def rebinding(host, port=None, *args, **kwargs):
        if host != "rebind.example":
            return real(host, port, *args, **kwargs)
        asked.append(host)
        address = "8.8.8.8" if len(asked) % 2 else "127.0.0.1"  # public, then loopback, ...
        return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, int(port or 0)))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    try:
        url = f"https://rebind.example:{listener.port}/hook"
        assert client.post("/webhooks", json={"url": url}).status_code == 201
        job = _paused_job(client, store)
        asked.clear()
        assert sender.send_due() == 1
        assert listener.connections == 0  # nothing reached loopback
        (delivery,) = client.get(f"/jobs/{job}/webhooks").json()["data"]
        assert delivery["attempts"][0]["error"].startswith("not delivered")
        assert len(asked) == 1  # resolved once for the attempt
    finally:
        listener.close()


def test_the_recorded_error_does_not_tell_open_ports_from_closed(setup):
    """Before: "ConnectError: [Errno 111] Connection refused" against "RemoteProtocolError:
    Server disconnected": a tenant could map which ports of the receiver's host were open."""
    import socket

    client, store, settings, sender = setup
    open_port = _Listener()  # accepts, then closes at once
    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        for port in (open_port.port, closed_port):
            client.post("/webhooks", json={"url": f"http://127.0.0.1:{port}/hook"})
        job = _paused_job(client, store)
        assert sender.send_due() == 2
        errors = {d["url"]: d["attempts"][0]["error"] for d in client.get(f"/jobs/{job}/webhooks").json()["data"]}
        assert len(errors) == 2 and len(set(errors.values())) == 1, errors
        assert open_port.connections == 1
    finally:
        open_port.close()


def test_endpoints_per_tenant_are_capped(setup, receiver):
    """Before: unlimited (500 endpoints: one cancel queued 500 deliveries)."""
    client, _, settings, _ = setup
    for n in range(settings.webhook_endpoints_per_tenant):
        assert client.post("/webhooks", json={"url": f"{receiver.url}/{n}"}).status_code == 201
    refused = client.post("/webhooks", json={"url": receiver.url})
    assert refused.status_code == 409, refused.text
    error = refused.json()["error"]
    assert error["code"] == "webhook_endpoints_limit" and error["param"] == "url" and "DELETE" in error["message"]
    first = client.get("/webhooks").json()["data"][0]["id"]
    assert client.delete(f"/webhooks/{first}").status_code == 204
    assert client.post("/webhooks", json={"url": receiver.url}).status_code == 201


def test_deleting_an_endpoint_cancels_what_is_owed_to_it(setup, receiver):
    client, store, settings, sender = setup
    endpoint = client.post("/webhooks", json={"url": receiver.url}).json()["id"]
    receiver.codes = [500]
    job = _paused_job(client, store)
    start = store.get_job(job).updated_at
    assert sender.send_due(start) == 1  # answered 500: owed again in 10 s
    assert client.delete(f"/webhooks/{endpoint}").status_code == 204
    assert sender.send_due(start + timedelta(seconds=60)) == 0
    assert len(receiver.requests) == 1
    (delivery,) = client.get(f"/jobs/{job}/webhooks").json()["data"]
    assert delivery["status"] == "cancelled" and delivery["next_attempt_at"] is None
    # A job's own webhook_url is the job's, not the endpoint's: deleting an endpoint of the
    # same URL leaves its delivery owed.
    endpoint = client.post("/webhooks", json={"url": receiver.url}).json()["id"]
    receiver.codes = [500]
    own = _job(client, webhook_url=receiver.url)
    store.transition(own, JobStatus.queued, "validated")
    store.transition(own, JobStatus.cancelled, "cancelled")
    start = store.get_job(own).updated_at
    assert sender.send_due(start) == 1
    client.delete(f"/webhooks/{endpoint}")
    assert sender.send_due(start + timedelta(seconds=60)) == 1
    assert client.get(f"/jobs/{own}/webhooks").json()["data"][0]["status"] == "delivered"


def test_tenants_and_endpoints_take_turns(setup, receiver, eft_home):
    """Before: what was due went oldest first, so one tenant's 10 endpoints (one cancel) came
    before everyone else's deliveries. Now each tenant's first goes before any tenant's
    second, and no tenant has more than its share of attempts at once."""
    from tests.helpers.app import tenant_client

    client, store, settings, sender = setup
    for n in range(10):
        client.post("/webhooks", json={"url": f"{receiver.url}/a{n}"})
    _paused_job(client, store)  # 10 deliveries of tenant "default", due first
    other = tenant_client(client.app, store, tenant="other")
    with other:
        other.post("/webhooks", json={"url": f"{receiver.url}/b"})
        _paused_job(other, store)
    assert sender.send_due(limit=3) == 3
    assert len(receiver.paths) == 3
    tenants = sorted(p.rsplit("/", 1)[-1][0] for p in receiver.paths)
    assert tenants == ["a", "a", "b"], tenants  # the default tenant's share is 2 at once


def test_a_tenants_stalling_receivers_do_not_delay_another_tenants_deliveries(setup, receiver, monkeypatch):
    """The sender as a replica runs it: tenant "default" has four endpoints that drip their
    answers; the other tenant's delivery takes about as long as alone (before: behind every
    dripping attempt, one at a time)."""
    import threading
    import time

    from tests.helpers.app import tenant_client

    client, store, settings, _ = setup
    fast = settings.model_copy(update={"webhook_timeout_s": 3.0, "webhook_poll_interval_s": 0.05})
    sender = WebhookSender(store.engine, fast)
    thread = threading.Thread(target=sender.run_forever, daemon=True)
    thread.start()
    stop = threading.Event()

    def drip(conn):
        _read_request(conn)
        for byte in b"HTTP/1.1 200 OK\r\nX-Slow: " + b"a" * 60:
            if stop.wait(0.2):
                return
            conn.sendall(bytes([byte]))

    listeners = [_Listener(drip) for _ in range(4)]
    receiver.delay_s = 0.3
    other = tenant_client(client.app, store, tenant="other")
    try:
        with other:
            other.post("/webhooks", json={"url": receiver.url})

            def latency():
                receiver.answered.clear()
                started = time.monotonic()
                _paused_job(other, store)
                assert receiver.answered.wait(60)
                return time.monotonic() - started

            alone = min(latency(), latency())
            for listener in listeners:
                client.post("/webhooks", json={"url": f"http://127.0.0.1:{listener.port}/hook"})
            _paused_job(client, store)  # four deliveries that each hold an attempt for its deadline
            time.sleep(0.2)  # the sender has taken them up
            during = latency()
    finally:
        stop.set()
        sender.close()
        for listener in listeners:
            listener.close()
    print(f"alone {alone:.2f} s, during {during:.2f} s")
    assert during <= 3 * alone, (during, alone)
