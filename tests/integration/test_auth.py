"""API keys and tenants over the real app and store: a key is needed, each key sees only its
tenant's jobs (others' ids answer 404 on every job endpoint), an admin sees all, a revoked key
stops at once, and `eft keys` manages keys straight against the store."""

import contextlib
import json

import pytest
from typer.testing import CliRunner

from eft.cli.main import app as cli
from eft.service.accounts.auth import KeyStore
from eft.service.settings import get_settings
from eft.service.store.store import Store
from tests.helpers.app import service_app

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
JOB_PATHS = ["", "/events", "/metrics", "/checkpoints"]


@pytest.fixture
def keys(client):
    store = Store(get_settings().resolved_database_url)
    yield KeyStore(store.engine)
    store.close()


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _job(client, eft_home, headers=None) -> dict:
    (eft_home / "data" / "t.jsonl").write_text(json.dumps(CHAT) + "\n")
    r = client.post("/jobs", json={"model": "tiny-llama", "training_file": "t.jsonl"}, headers=headers)
    assert r.status_code == 201, r.text
    return r.json()


@pytest.mark.parametrize("header", [None, "Bearer", "Basic abc", "Bearer eft-not-a-key"])
def test_requests_without_a_valid_key_get_401_envelopes(client, header):
    headers = {"Authorization": header} if header else {}
    client.headers.pop("Authorization")
    for method, path in [("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/jobs/ftjob-x"),
                         ("POST", "/plan")]:
        r = client.request(method, path, headers=headers, json={})
        assert r.status_code == 401, (method, path, r.text)
        error = r.json()["error"]
        assert error["type"] == "authentication_error" and error["param"] == "authorization"
        assert r.headers["x-request-id"]
    assert client.get("/healthz").status_code == 200  # probes need no key


def test_a_tenant_sees_only_its_own_jobs_and_an_admin_sees_all(client, keys, eft_home):
    mine = _job(client, eft_home)
    _, other = keys.create("team-b")
    _, admin = keys.create("ops", "admin")
    for suffix in JOB_PATHS:
        r = client.get(f"/jobs/{mine['id']}{suffix}", headers=_auth(other))
        assert r.status_code == 404, (suffix, r.text)
        assert r.json()["error"]["code"] == "job_not_found"
        assert client.get(f"/jobs/{mine['id']}{suffix}", headers=_auth(admin)).status_code == 200
    assert client.post(f"/jobs/{mine['id']}/cancel", headers=_auth(other)).status_code == 404
    assert client.get("/jobs", headers=_auth(other)).json()["data"] == []
    theirs = _job(client, eft_home, _auth(other))
    assert [j["id"] for j in client.get("/jobs").json()["data"]] == [mine["id"]]
    listed = client.get("/jobs", headers=_auth(admin)).json()["data"]
    assert {j["id"] for j in listed} == {mine["id"], theirs["id"]}
    assert client.get(f"/jobs/{mine['id']}").json()["status"] == "validating"  # untouched


def test_a_revoked_key_is_refused_at_once(client, keys, eft_home):
    record, key = keys.create("team-c")
    assert client.get("/jobs", headers=_auth(key)).status_code == 200
    keys.revoke(record.id)
    assert client.get("/jobs", headers=_auth(key)).status_code == 401


def test_the_bootstrap_admin_key_comes_from_the_environment(eft_home, monkeypatch):
    from fastapi.testclient import TestClient


    monkeypatch.setenv("EFT_ADMIN_API_KEY", "eft-bootstrap-secret")
    get_settings.cache_clear()
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    with TestClient(service_app(store, settings)) as c:
        assert c.get("/jobs", headers=_auth("eft-bootstrap-secret")).status_code == 200
        assert c.get("/jobs", headers=_auth("eft-bootstrap-secreT")).status_code == 401
    store.close()


def test_eft_keys_create_list_revoke_against_the_store(client, eft_home):
    runner = CliRunner()
    made = runner.invoke(cli, ["keys", "create", "--tenant", "team-d", "--name", "ci", "--json"])
    assert made.exit_code == 0, made.output
    created = json.loads(made.output)
    assert created["key"].startswith("eft-") and created["tenant"] == "team-d"
    assert client.get("/jobs", headers=_auth(created["key"])).status_code == 200
    listed = json.loads(runner.invoke(cli, ["keys", "list", "--json"]).output)["data"]
    row = next(k for k in listed if k["id"] == created["id"])
    assert row["role"] == "user" and "key" not in row and created["key"] not in json.dumps(listed)
    assert runner.invoke(cli, ["keys", "revoke", created["id"]]).exit_code == 0
    assert client.get("/jobs", headers=_auth(created["key"])).status_code == 401
    assert runner.invoke(cli, ["keys", "revoke", "key_nope"]).exit_code == 1
    assert runner.invoke(cli, ["keys", "create", "--role", "root"]).exit_code == 2


def test_eft_tenants_set_and_get_the_quotas_the_api_enforces(client, eft_home):
    runner = CliRunner()
    made = runner.invoke(cli, ["tenants", "set", "team-q", "--max-active-jobs", "0", "--max-gpus", "2", "--json"])
    assert made.exit_code == 0, made.output
    limits = json.loads(made.stdout)
    assert (limits["max_active_jobs"], limits["max_gpus"], limits["queue_over_quota"]) == (0, 2, False)
    assert json.loads(runner.invoke(cli, ["tenants", "get", "team-q", "--json"]).stdout) == limits
    key = json.loads(runner.invoke(cli, ["keys", "create", "--tenant", "team-q", "--json"]).stdout)["key"]
    refused = client.post("/jobs", headers=_auth(key), json={"model": "tiny-llama", "training_file": "x.jsonl"})
    assert refused.status_code == 429 and refused.json()["error"]["param"] == "tenant.max_active_jobs"
    assert runner.invoke(cli, ["tenants", "set", "team-q", "--max-cpus", "-1"]).exit_code == 2


def test_keys_are_stored_hashed(client, keys):
    import sqlalchemy as sa

    _, key = keys.create("team-e")
    with keys.engine.connect() as conn:
        stored = json.dumps([list(r) for r in conn.execute(sa.text("SELECT * FROM api_keys")).all()],
                            default=str)
    assert key not in stored and key[10:] not in stored


def test_the_client_reads_the_key_eft_up_writes(eft_home, monkeypatch):
    from eft import Client
    from eft._config import write_config
    from eft.api.local import ensure_local_key

    monkeypatch.delenv("EFT_API_KEY", raising=False)
    monkeypatch.delenv("EFT_BASE_URL", raising=False)
    path = ensure_local_key(get_settings(), "http://127.0.0.1:8123")
    assert path == eft_home / "config.json" and oct(path.stat().st_mode)[-3:] == "600"
    client = Client()
    assert client.base_url == "http://127.0.0.1:8123" and client.api_key.startswith("eft-")
    # A second `eft up` keeps a key the store still accepts; a stale one is replaced.
    assert ensure_local_key(get_settings(), "http://127.0.0.1:8123") and Client().api_key == client.api_key
    write_config(api_key="eft-stale")
    ensure_local_key(get_settings(), "http://127.0.0.1:8123")
    assert Client().api_key not in ("eft-stale", client.api_key)


@contextlib.contextmanager
def _app_with(monkeypatch, **env):
    """The app over a fresh store, with these `EFT_*` settings; yields (client, key store)."""
    from fastapi.testclient import TestClient


    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    settings = get_settings()
    store = Store(settings.resolved_database_url)
    try:
        with TestClient(service_app(store, settings)) as client:
            yield client, KeyStore(store.engine)
    finally:
        store.close()


def test_a_tenant_over_its_request_rate_gets_429_and_slows_no_one_else(eft_home, monkeypatch):
    """Each tenant has its own token bucket: a burst past it is 429 with Retry-After in the
    error envelope, while another tenant's requests keep answering 200."""
    with _app_with(monkeypatch, EFT_REQUESTS_PER_S_PER_TENANT="0.01", EFT_REQUEST_BURST_PER_TENANT="5") as (client, keys):
        noisy, quiet = (f"Bearer {keys.create(t)[1]}" for t in ("noisy", "quiet"))
        codes = [client.get("/jobs", headers={"Authorization": noisy}).status_code for _ in range(8)]
        assert codes == [200] * 5 + [429] * 3
        limited = client.get("/jobs", headers={"Authorization": noisy})
        error = limited.json()["error"]
        assert error["type"] == "rate_limit_error" and error["code"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
        assert client.get("/jobs", headers={"Authorization": quiet}).status_code == 200
        assert client.get("/healthz").status_code == 200  # unauthenticated, never limited


def test_only_admins_are_told_where_rays_dashboard_is(eft_home, monkeypatch):
    """Ray's dashboard runs arbitrary code through its Jobs API: the UI's pages do not name it,
    and `GET /me` gives its address to admins only."""
    with _app_with(monkeypatch, EFT_RAY_DASHBOARD_URL="http://10.1.2.3:8265") as (client, keys):
        user, admin = (f"Bearer {keys.create('team-a', role)[1]}" for role in ("user", "admin"))
        mine = client.get("/me", headers={"Authorization": user}).json()
        assert mine["tenant"] == "team-a" and mine["role"] == "user" and mine["ray_dashboard_url"] is None
        assert client.get("/me", headers={"Authorization": admin}).json()["ray_dashboard_url"] == "http://10.1.2.3:8265"
        for page in ("/ui", "/ui/new", "/ui/jobs/ftjob-x"):
            assert "10.1.2.3" not in client.get(page).text, page
        assert client.get("/me").status_code == 401
