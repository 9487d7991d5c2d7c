"""The service's observability surface over a real store, without Ray: /metrics in Prometheus
text, the /ui pages and their static files, and the 4xx answers of logs and manifest."""

import json

from prometheus_client.parser import text_string_to_metric_families

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def _samples(client) -> dict[tuple[str, tuple], float]:
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


def _create(client, eft_home) -> dict:
    (eft_home / "data" / "train.jsonl").write_text(json.dumps(CHAT) + "\n")
    r = client.post("/jobs", json={"model": "tiny-llama", "training_file": "train.jsonl", "name": "obs"})
    assert r.status_code == 201, r.text
    return r.json()


def test_metrics_count_requests_by_route_template_and_jobs_by_status(client, eft_home):
    before = _samples(client)
    job = _create(client, eft_home)
    assert client.get(f"/jobs/{job['id']}").status_code == 200
    assert client.get("/jobs/ftjob-nope").status_code == 404
    after = _samples(client)

    def delta(name, **labels):
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    route = {"method": "GET", "route": "/jobs/{job_id}"}
    assert delta("eft_http_requests_total", **route, status="200") == 1
    assert delta("eft_http_requests_total", **route, status="404") == 1
    assert delta("eft_http_requests_total", method="POST", route="/jobs", status="201") == 1
    assert delta("eft_http_request_duration_seconds_count", **route) == 2
    assert after[("eft_jobs", (("status", "validating"),))] == 1
    assert after[("eft_jobs", (("status", "running"),))] == 0
    assert after[("eft_queue_depth", ())] == 0


def test_job_carries_progress_fields(client, eft_home):
    job = client.get(f"/jobs/{_create(client, eft_home)['id']}").json()
    assert job["progress"] is None and job["estimated_finish"] is None and job["trained_tokens"] is None


def test_ui_pages_and_static_files(client, eft_home):
    job = _create(client, eft_home)
    listing = client.get("/ui")
    assert listing.status_code == 200 and 'data-page="list"' in listing.text and 'id="jobs"' in listing.text
    page = client.get(f"/ui/jobs/{job['id']}")
    assert f'data-job-id="{job["id"]}"' in page.text and 'id="loss-chart"' in page.text
    assert 'data-page="new"' in client.get("/ui/new").text
    # Markup in an id is escaped, never rendered.
    assert "<script>alert" not in client.get("/ui/jobs/<script>alert(1)</script>").text
    for path in ("/ui/static/ui.js", "/ui/static/ui.css", "/ui/static/vendor/uplot/uPlot.iife.min.js"):
        assert client.get(path).status_code == 200, path
    assert "Authorization" in client.get("/ui/static/ui.js").text
    assert client.get("/", follow_redirects=False).headers["location"] == "/ui"


def test_ui_pages_run_only_their_own_scripts_and_are_never_framed(client, eft_home):
    job = _create(client, eft_home)
    for path in ("/ui", "/ui/new", f"/ui/jobs/{job['id']}"):
        headers = client.get(path).headers
        policy = dict(part.strip().split(" ", 1) for part in headers["content-security-policy"].split(";"))
        assert policy["script-src"] == "'self'" and policy["frame-ancestors"] == "'none'", policy
        assert "unsafe-inline" not in headers["content-security-policy"]
        assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
    # The page runs no inline script or handler attribute that the policy would block.
    page = client.get(f"/ui/jobs/{job['id']}").text
    assert "<script>" not in page and " onclick=" not in page and " style=" not in page
    for path in ("/ui/static/ui.js", "/ui/static/ui.css"):
        assert client.get(path).headers["x-content-type-options"] == "nosniff", path
    # A link's key replaces a stored one only after the user confirms (ui.js).
    script = client.get("/ui/static/ui.js").text
    assert "window.confirm(" in script and "stored === offered" in script


def test_logs_and_manifest_before_the_job_ran_are_409_with_the_envelope(client, eft_home):
    job = _create(client, eft_home)
    for path in (f"/jobs/{job['id']}/logs", f"/jobs/{job['id']}/manifest"):
        r = client.get(path)
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["param"] == "job_id" and "yet" in error["message"]
    r = client.get(f"/jobs/{job['id']}/logs", params={"attempt": 3})
    assert r.status_code == 409 and r.json()["error"]["param"] == "attempt"
    r = client.get("/jobs/ftjob-nope/logs", params={"follow": "true"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "job_not_found"
    assert client.get(f"/jobs/{job['id']}/logs", params={"tail": 0}).status_code == 422


def test_latest_metric_values_takes_each_jobs_newest_row(database_url):
    from eft.service.store.store import Store
    from eft.types.jobs import JobStatus

    store = Store(database_url)
    try:
        a = store.create_job(tenant="t", request={}, name=None)
        b = store.create_job(tenant="t", request={}, name=None)
        for job in (a, b):
            store.transition(job.id, JobStatus.queued, "validated")
            store.transition(job.id, JobStatus.running, "dispatched", attempt=1)
        store.record_metrics(a.id, 1, 1, {"loss": 2.0, "trained_tokens": 10})
        store.record_metrics(a.id, 1, 2, {"loss": 1.5, "trained_tokens": 20})
        store.record_metrics(b.id, 1, 1, {"loss": 3.0})
        latest = store.latest_metric_values([a.id, b.id, "ftjob-none"])
        assert latest == {a.id: {"loss": 1.5, "trained_tokens": 20}, b.id: {"loss": 3.0}}
        assert store.latest_metric_values([]) == {}
    finally:
        store.close()


def test_log_streams_are_bounded_per_tenant_and_in_time(client, eft_home):
    """A tenant holds at most EFT_LOG_STREAMS_PER_TENANT streams (one more is a 429), and a
    stream ends with `stream_time_limit` after EFT_LOG_STREAM_MAX_S."""
    from eft.service.runs.logs import LogStreams

    client.app.state.log_streams = LogStreams(per_tenant=1, max_seconds=0.5)
    job = _create(client, eft_home)  # never dispatched here: its stream waits for a Ray Job
    with client.stream("GET", f"/jobs/{job['id']}/logs", params={"follow": "true"}) as first:
        assert first.status_code == 200
        lines = first.iter_lines()
        assert next(lines).startswith(":")  # the first keep-alive: the stream is open
        second = client.get(f"/jobs/{job['id']}/logs", params={"follow": "true"})
        assert second.status_code == 429 and second.json()["error"]["code"] == "rate_limited"
        rest = list(lines)
    assert any('"stream_time_limit"' in line for line in rest), rest
    # The ended stream gave its place back.
    with client.stream("GET", f"/jobs/{job['id']}/logs", params={"follow": "true"}) as again:
        assert again.status_code == 200


def test_metrics_come_in_pages_of_steps(service):
    client, store, _ = service
    from eft.types.jobs import JobStatus

    job = store.create_job(tenant="default", request={"model": "tiny-llama", "training_file": "t.jsonl"})
    store.transition(job.id, JobStatus.queued, "validated")
    store.transition(job.id, JobStatus.running, "dispatched", attempt=1)
    for step in range(1, 6):
        store.record_metrics(job.id, 1, step, {"loss": 1.0 / step})
    page = client.get(f"/jobs/{job.id}/metrics", params={"limit": 2}).json()
    assert [m["step"] for m in page["data"]] == [1, 2] and page["has_more"]
    rest = client.get(f"/jobs/{job.id}/metrics", params={"limit": 10, "after_step": 2}).json()
    assert [m["step"] for m in rest["data"]] == [3, 4, 5] and not rest["has_more"]
