"""Uploads over the real app and store: streamed to disk with their SHA-256, size-limited,
tenant-scoped, usable as a job's training file, and validated line by line without a job."""

import hashlib
import json

import pytest

from eft.service.accounts.auth import KeyStore
from eft.service.settings import get_settings
from eft.service.store.store import Store

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def _jsonl(*records) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records).encode()


def _upload(client, content: bytes, name="train.jsonl", headers=None):
    return client.post("/files", files={"file": (name, content, "application/jsonl")},
                       data={"purpose": "fine-tune"}, headers=headers)


@pytest.fixture
def other_tenant(client):
    store = Store(get_settings().resolved_database_url)
    _, key = KeyStore(store.engine).create("team-b")
    yield {"Authorization": f"Bearer {key}"}
    store.close()


def test_upload_list_get_content_delete(client, eft_home):
    content = _jsonl(CHAT, CHAT)
    r = _upload(client, content)
    assert r.status_code == 201, r.text
    f = r.json()
    assert f["id"].startswith("file-") and f["bytes"] == len(content)
    assert f["sha256"] == hashlib.sha256(content).hexdigest() and f["filename"] == "train.jsonl"
    assert client.get(f"/files/{f['id']}").json() == f
    assert client.get(f"/files/{f['id']}/content").content == content
    assert [x["id"] for x in client.get("/files").json()["data"]] == [f["id"]]
    assert client.delete(f"/files/{f['id']}").json() == {"id": f["id"], "object": "file", "deleted": True}
    assert client.get(f"/files/{f['id']}").status_code == 404
    assert not list((eft_home / "files").glob("file-*"))


def test_files_paginate_with_a_cursor(client):
    ids = [_upload(client, _jsonl(CHAT)).json()["id"] for _ in range(3)]
    first = client.get("/files", params={"limit": 2}).json()
    assert first["has_more"] and [f["id"] for f in first["data"]] == ids[::-1][:2]
    rest = client.get("/files", params={"limit": 2, "after": first["next_cursor"]}).json()
    assert [f["id"] for f in rest["data"]] == [ids[0]] and not rest["has_more"]


def test_an_upload_over_the_limit_is_413_and_leaves_nothing(eft_home, monkeypatch, client):
    client.app.state.files.settings = get_settings().model_copy(update={"max_upload_bytes": 100})
    r = _upload(client, _jsonl(*[CHAT] * 10))
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert client.get("/files").json()["data"] == []
    assert not [p for p in (eft_home / "files").iterdir()]


@pytest.mark.parametrize("name", ["../evil.jsonl", "/etc/passwd", "a\\b.jsonl", "..", ""])
def test_path_like_file_names_are_refused(client, name, eft_home):
    r = _upload(client, _jsonl(CHAT), name=name)
    assert r.status_code in (400, 422), r.text
    assert "error" in r.json()
    assert client.get("/files").json()["data"] == []


def test_other_tenants_files_are_404_everywhere(client, other_tenant, eft_home):
    f = _upload(client, _jsonl(CHAT)).json()
    for method, path in [("GET", ""), ("GET", "/content"), ("DELETE", ""), ("POST", "/validate")]:
        r = client.request(method, f"/files/{f['id']}{path}", headers=other_tenant)
        assert r.status_code == 404 and r.json()["error"]["code"] == "file_not_found", (method, path)
    assert client.get("/files", headers=other_tenant).json()["data"] == []
    r = client.post("/jobs", json={"model": "tiny-llama", "training_file": f["id"]}, headers=other_tenant)
    assert r.status_code == 422 and r.json()["error"]["errors"][0]["code"] == "file_not_found"
    assert client.get(f"/files/{f['id']}").status_code == 200  # still there


def test_a_job_trains_on_an_uploaded_file(client):
    f = _upload(client, _jsonl(CHAT, CHAT)).json()
    r = client.post("/jobs", json={"model": "tiny-llama", "training_file": f["id"]})
    assert r.status_code == 201, r.text
    assert r.json()["training_file"] == f["id"]


def test_an_upload_with_an_idempotency_key_is_stored_once(client):
    headers = {"Idempotency-Key": "upload-1"}
    a = _upload(client, _jsonl(CHAT), headers=headers)
    b = _upload(client, _jsonl(CHAT), headers=headers)
    assert (a.status_code, b.status_code) == (201, 200) and a.json()["id"] == b.json()["id"]
    assert _upload(client, _jsonl(CHAT, CHAT), headers=headers).status_code == 409
    assert len(client.get("/files").json()["data"]) == 1


# A corpus of broken records: (line, field, words in the message), every one reported at once.
BROKEN = [
    ('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}', None),
    ('{"messages": [{"role": "user", "content": "hi"}', ("line", "not valid JSON")),
    ('{"messages": [{"role": "assistant", "content": "first"}]}', ("messages[0].role", "expected 'user'")),
    ('{"messages": [{"role": "user", "content": "   "}, {"role": "assistant", "content": "x"}]}',
     ("messages[0].content", "empty")),
    ('{"messages": [{"role": "user", "content": "a"}, '
     '{"role": "assistant", "content": "c", "weight": 2}]}', ("messages[1].weight", "0 (not trained) or 1")),
    ('{"messages": [{"role": "user", "content": "a"}, {"role": "wizard", "content": "b"}, '
     '{"role": "assistant", "content": "c"}]}', ("messages[1].role", "must be one of")),
    ('{"prompt": "p"}', ("completion", "missing")),
    ('{"text": "classify me", "label": ""}', ("label", "empty")),
    ('{"text": "classify me", "label": [1]}', ("label", "string or an integer")),
    ('{"nothing": 1}', ("record", "must be an object")),
    ('[1, 2, 3]', ("record", "must be an object")),
    ('{"text": 5}', ("text", "must be a string")),
]


def test_validate_reports_every_broken_line_with_exact_numbers(client):
    content = "\n".join(line for line, _ in BROKEN).encode() + b"\n\xff\xfe not utf-8\n"
    f = _upload(client, content, name="broken.jsonl").json()
    report = client.post(f"/files/{f['id']}/validate", json={}).json()
    expected = [(i + 1, *want) for i, (_, want) in enumerate(BROKEN) if want]
    expected.append((len(BROKEN) + 1, "line", "UTF-8"))
    got = [(e["line"], e["field"], e["message"]) for e in report["errors"]]
    assert [(line, field) for line, field, _ in got] == [(line, field) for line, field, _ in expected]
    for (_, _, message), (_, _, words) in zip(got, expected):
        assert words in message, (message, words)
    assert all(e["file"] == "broken.jsonl" for e in report["errors"])
    assert report["ok"] is False and report["errors_total"] == len(expected)
    assert report["records"] == len(BROKEN) + 1 and report["formats"] == {"chat": 1}


def test_validate_caps_errors_but_counts_them_all(client):
    f = _upload(client, _jsonl(*[{"nope": i} for i in range(50)])).json()
    report = client.post(f"/files/{f['id']}/validate").json()
    assert len(report["errors"]) == get_settings().max_validation_errors
    assert report["errors_total"] == 50


def test_validate_with_a_tokenizer_shows_stats_loss_tokens_and_warnings(client):
    pair = {"prompt": "Say the word blue", "completion": " blue"}
    long = {"prompt": "word " * 200, "completion": " end"}
    train = _upload(client, _jsonl(pair, pair, {"text": "a cat", "label": "animal"}, long)).json()
    valid = _upload(client, _jsonl(pair), name="valid.jsonl").json()
    r = client.post(f"/files/{train['id']}/validate",
                    json={"model": "tiny-llama", "max_seq_len": 64, "validation_file": valid["id"]})
    assert r.status_code == 200, r.text
    report = r.json()
    tokens = report["tokens"]
    assert tokens["min"] < tokens["max"] and tokens["max"] > 64 and tokens["truncated"] == 1
    assert tokens["min"] <= tokens["mean"] <= tokens["max"]
    codes = {(w["code"], w["line"]) for w in report["warnings"]}
    assert ("duplicate", 2) in codes and ("train_validation_overlap", 1) in codes
    # The long prompt leaves no completion token inside 64 tokens: a job would leave line 4 out.
    assert ("no_loss_tokens", 4) in codes and report["errors"] == [] and report["ok"]
    example = report["example"]
    loss_text = "".join(t["token"] for t in example if t["loss"])
    assert "blue" in loss_text and "Say" not in loss_text
    assert not example[0]["loss"] and example[-1]["loss"]


def test_validate_names_an_unknown_model(client):
    f = _upload(client, _jsonl(CHAT)).json()
    r = client.post(f"/files/{f['id']}/validate", json={"model": "no-such-model"})
    assert r.status_code == 422 and r.json()["error"]["errors"][0]["param"] == "model"


def test_a_schema_invalid_job_never_reads_another_tenants_file(client, other_tenant):
    """The 422 handler checks what a body names to list every problem at once; it checks
    ownership first, so another tenant's file id is only `file_not_found`, never scanned or
    quoted (before, its broken lines came back in the error)."""
    secret = "the-launch-code-is-4711"
    f = _upload(client, _jsonl(CHAT, {"messages": [{"role": "user", "content": secret}]}, "{" + secret)).json()
    body = {"model": "tiny-llama", "training_file": f["id"], "hyperparameters": {"learning_rate": "fast"}}
    r = client.post("/jobs", json=body, headers=other_tenant)
    assert r.status_code == 422
    errors = r.json()["error"]["errors"]
    assert {(e["param"], e["code"]) for e in errors} >= {("training_file", "file_not_found")}, errors
    assert secret not in r.text and "line 3" not in r.text
    # The owner, making the same mistake, hears about the broken line too.
    own = client.post("/jobs", json=body)
    assert own.status_code == 422 and "line 3" in own.text


def test_an_upload_a_job_still_uses_cannot_be_deleted(client):
    f = _upload(client, _jsonl(CHAT, CHAT)).json()
    job = client.post("/jobs", json={"model": "tiny-llama", "training_file": f["id"]}).json()
    r = client.delete(f"/files/{f['id']}")
    assert r.status_code == 409, r.text
    error = r.json()["error"]
    assert error["code"] == "file_in_use" and job["id"] in error["message"]
    assert client.get(f"/files/{f['id']}/content").status_code == 200  # nothing was removed
    client.post(f"/jobs/{job['id']}/cancel")
    assert client.delete(f"/files/{f['id']}").status_code == 200


def test_a_tenants_upload_storage_is_limited_in_count_and_bytes(client, other_tenant, eft_home):
    settings = client.app.state.files.settings
    client.app.state.files.settings = settings.model_copy(update={"max_files_per_tenant": 2,
                                                                  "max_file_bytes_per_tenant": 1000})
    small = _jsonl(CHAT)
    assert [_upload(client, small).status_code for _ in range(2)] == [201, 201]
    third = _upload(client, small)
    assert third.status_code == 429 and third.json()["error"]["code"] == "quota_exceeded"
    assert int(third.headers["retry-after"]) > 0
    # Bytes: a file that would take the tenant past its storage is 413, and nothing is kept.
    client.delete(f"/files/{client.get('/files').json()['data'][0]['id']}")
    big = _upload(client, _jsonl(*[CHAT] * 20))
    assert big.status_code == 413 and "EFT_MAX_FILE_BYTES_PER_TENANT" in big.json()["error"]["message"]
    assert len(client.get("/files").json()["data"]) == 1
    assert not list((eft_home / "files").glob(".upload-*"))
    # Another tenant's storage is its own.
    assert _upload(client, small, headers=other_tenant).status_code == 201
