"""Storage by URI against an S3-compatible server (moto's, on loopback): locations, and the
artifact's publish (staged, copied, committed last) and download."""

from __future__ import annotations

import json
import secrets
import socket

import pytest

from eft.training import storage
from eft.training.artifacts import COMMIT_MARKER, MANIFEST, download, is_committed, publish

BUCKET = "eft-it"


@pytest.fixture(scope="module")
def s3_server():
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_server, monkeypatch):
    import boto3

    env = {"AWS_ENDPOINT_URL": s3_server, "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": secrets.token_hex(8), "AWS_REGION": "us-east-1"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    yield client
    for obj in client.list_objects_v2(Bucket=BUCKET).get("Contents", []):
        client.delete_object(Bucket=BUCKET, Key=obj["Key"])
    client.delete_bucket(Bucket=BUCKET)


def _adapter(tmp_path, name: str, text: str):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(text)
    return folder


def test_locations_map_paths_and_uris(tmp_path, s3):
    local = storage.resolve(tmp_path / "ckpt")
    assert not local.remote and local.uri == local.path == str(tmp_path / "ckpt")
    remote = storage.resolve(f"s3://{BUCKET}/checkpoints/")
    assert remote.remote and remote.path == f"{BUCKET}/checkpoints"
    child = remote.child("ftjob-1")
    assert child.uri == f"s3://{BUCKET}/checkpoints/ftjob-1"
    assert remote.uri_of(f"{BUCKET}/checkpoints/ftjob-1/checkpoint_0") == f"s3://{BUCKET}/checkpoints/ftjob-1/checkpoint_0"
    storage.write_text(remote.filesystem, f"{child.path}/a.txt", "hello")
    assert storage.read_text(remote.filesystem, f"{child.path}/a.txt") == "hello"
    assert storage.size_bytes(remote.filesystem, child.path) == 5
    assert storage.exists(f"{child.uri}/a.txt") and not storage.exists(f"{child.uri}/b.txt")
    assert storage.storage_environment()["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1")


def test_publish_to_s3_commits_last_and_replaces_a_previous_artifact(tmp_path, s3):
    uri = f"s3://{BUCKET}/artifacts/ftjob-x"
    first = _adapter(tmp_path, "a1", "one")
    (first / "stale.bin").write_text("x")
    assert publish(first, uri, {"n": 1}) == uri
    assert publish(_adapter(tmp_path, "a2", "two"), uri, {"n": 2}) == uri
    # (Keys ending in "/" are the empty directory markers pyarrow keeps.)
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"] if not o["Key"].endswith("/"))
    assert keys == [f"artifacts/ftjob-x/{n}" for n in ("adapter_config.json", COMMIT_MARKER, MANIFEST)]
    out = download(uri, tmp_path / "copy")
    assert (out / "adapter_config.json").read_text() == "two"
    assert json.loads((out / MANIFEST).read_text()) == {"n": 2}


def test_an_artifact_without_its_marker_is_not_read(tmp_path, s3):
    uri = f"s3://{BUCKET}/artifacts/ftjob-y"
    # What a publish cut short before its commit leaves behind.
    s3.put_object(Bucket=BUCKET, Key="artifacts/ftjob-y/adapter_config.json", Body=b"{}")
    assert not is_committed(uri)
    with pytest.raises(FileNotFoundError, match="no committed artifact"):
        download(uri, tmp_path / "copy")
