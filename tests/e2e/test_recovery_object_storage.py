"""Checkpoints and artifacts in an S3-compatible object store (moto's server on loopback), and
a job store on PostgreSQL reached with a password.

One job runs with both roots in a bucket; a worker is killed after its first checkpoint, the
worker group restarts by reading that checkpoint back from the bucket, and the finished adapter
is downloaded from the bucket and loaded with PEFT. Credentials never leave the service's own
environment: the object-store secret, the database password and the admin key appear nowhere
in the job, its events, the job store, or any answer of Ray's dashboard API (jobs, Serve
applications, actors, tasks, runtime environments, logs).
"""

from __future__ import annotations

import os
import secrets
import signal

import pytest

from tests.helpers.service_api import free_port, api, used_later, wait_for
from tests.helpers.jobs import checkpointed, events_of, fetch, lora_body, post, until, worker_pids

BUCKET = "eft-test"


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on loopback with one bucket; yields the storage environment."""
    import boto3
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "eft-test-key",
        "AWS_SECRET_ACCESS_KEY": f"secret-{secrets.token_hex(12)}",
        "AWS_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    client = boto3.client("s3", endpoint_url=env["AWS_ENDPOINT_URL"], region_name="us-east-1",
                          aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                          aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"])
    client.create_bucket(Bucket=BUCKET)
    yield {"env": env, "client": client}
    server.stop()


DB_PASSWORD = f"pw-{secrets.token_hex(10)}"


@pytest.fixture
def s3_service(service, s3, request):
    from tests.helpers.databases import postgres_schema_url

    with postgres_schema_url("eft_e2e") as url:
        # The local server trusts loopback, so any password is accepted: the point is that
        # the service holds one and must not let it out.
        database_url = url.replace("postgres@", f"postgres:{DB_PASSWORD}@", 1)
        service["restart"](
            EFT_CHECKPOINT_ROOT=f"s3://{BUCKET}/checkpoints", EFT_ARTIFACT_ROOT=f"s3://{BUCKET}/artifacts",
            EFT_FILES_ROOT=f"s3://{BUCKET}/files", EFT_DATABASE_URL=database_url, **s3["env"],
        )
        try:
            yield service
        finally:
            if used_later(request):
                service["restart"]()


def _keys(client, prefix: str) -> list[str]:
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    # Keys ending in "/" are the empty directory markers pyarrow keeps, not files.
    return [o["Key"] for page in pages for o in page.get("Contents", []) if not o["Key"].endswith("/")]


def test_checkpoints_and_artifact_in_object_storage_survive_a_killed_worker(s3_service, s3, tmp_path):
    url = s3_service["url"]
    job = post(url, lora_body("s3-kill-a-worker", 80, checkpoint={"every_steps": 20}))
    jid = job["id"]
    latest = until("a checkpoint in the bucket", lambda: checkpointed(url, jid, 20))
    pids = worker_pids(s3_service["dashboard_url"], fetch(url, jid))
    assert len(pids) == 2, pids
    os.kill(pids[1], signal.SIGKILL)
    done = wait_for(jid, url, {"succeeded"})

    # The restarted workers read the checkpoint back from the bucket.
    assert done["restarts"] == 1 and done["attempt"] == 1
    events = events_of(url, jid)
    resumed = [e for e in events if e["type"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["data"]["step"] >= latest
    checkpoints = fetch(url, jid, "/checkpoints")
    assert checkpoints and all(c["path"].startswith(f"s3://{BUCKET}/checkpoints/{jid}/") for c in checkpoints)
    assert all(c["size_bytes"] > 0 for c in checkpoints)
    keys = _keys(s3["client"], f"checkpoints/{jid}/")
    assert any(k.endswith("trainable.safetensors") for k in keys), keys
    assert not (s3_service["home"] / "checkpoints" / jid).exists()  # nothing went to local disk

    # The artifact is committed in the bucket and loads with PEFT after a download.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from eft.service.settings import BUNDLED_ASSETS
    from eft.training import artifacts

    assert done["artifact_path"] == f"s3://{BUCKET}/artifacts/{jid}/attempt-{done['attempt']}"
    prefix = f"artifacts/{jid}/attempt-{done['attempt']}"
    keys = _keys(s3["client"], f"{prefix}/")
    assert f"{prefix}/{artifacts.COMMIT_MARKER}" in keys
    assert not [k for k in _keys(s3["client"], "artifacts/") if "/.staging/" in k]  # staging cleaned up
    # The manifest is read through the storage layer, from the bucket.
    manifest = api.get(f"{url}/jobs/{jid}/manifest")
    assert manifest.status_code == 200 and manifest.json()["job_id"] == jid, manifest.text
    os.environ.update(s3["env"])
    try:
        local = artifacts.download(done["artifact_path"], tmp_path / "adapter")
    finally:
        for name in s3["env"]:
            os.environ.pop(name, None)
    base = AutoModelForCausalLM.from_pretrained(BUNDLED_ASSETS / "models" / "tiny-llama")
    model = PeftModel.from_pretrained(base, str(local))
    assert any("lora_A" in name for name, _ in model.named_parameters())

    # Credentials stay in the service's environment: not in the job, its events, the store.
    from tests.helpers.service_api import ADMIN_KEY

    leaks = (s3["env"]["AWS_SECRET_ACCESS_KEY"], DB_PASSWORD, ADMIN_KEY)
    for secret in leaks:
        assert secret not in api.get(f"{url}/jobs/{jid}").text
        assert secret not in api.get(f"{url}/jobs/{jid}/events?limit=1000").text
    assert done["ray_submission_id"]
    _assert_dashboard_keeps_no_secret(s3_service["dashboard_url"], done["ray_submission_id"], leaks)


def _assert_dashboard_keeps_no_secret(dashboard: str, submission_id: str, leaks: tuple[str, ...]) -> None:
    """Every answer of Ray's dashboard API a non-browser client gets, searched for credentials
    (as whoever holds the cluster's token: Ray turns token authentication on for a new local
    cluster, and then this process has the token)."""
    import httpx
    import ray

    from eft.training._ray import dashboard_auth_headers

    headers = dashboard_auth_headers()
    head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("node:__internal_head__"))
    answers = {}
    for path in ("/api/jobs/", f"/api/jobs/{submission_id}", f"/api/jobs/{submission_id}/logs",
                 "/api/serve/applications/", "/api/v0/actors?detail=true&limit=10000",
                 "/api/v0/tasks?detail=true&limit=10000", "/api/v0/runtime_envs?limit=10000",
                 "/api/v0/placement_groups?detail=true", "/nodes?view=summary",
                 f"/api/v0/logs?node_id={head}"):
        response = httpx.get(dashboard + path, headers=headers, timeout=60)
        assert response.status_code == 200, (path, response.status_code, response.text[:500])
        answers[path] = response.text
    # The job's runtime environment is there to see, and it names the secrets file, not secrets.
    assert "EFT_SECRETS_FILE" in answers[f"/api/jobs/{submission_id}"]
    assert "EFT_SECRETS_FILE" in answers["/api/serve/applications/"]
    for path, text in answers.items():
        for secret in leaks:
            assert secret not in text, f"a credential is in the dashboard's {path}"
