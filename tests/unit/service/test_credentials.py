"""Credentials never travel through Ray: what the launcher and `deploy_app` hand Ray holds no
secret, and the secrets file round-trips any value, is 0600, and never overrides a process's
own environment."""

from __future__ import annotations

import os
import stat

from eft.service import credentials
from eft.service.settings import Settings

PASSWORD = 'pa$$ w"o\\rd'
DB = f"postgresql+psycopg://eft:{PASSWORD.replace(' ', '%20').replace('$', '%24')}@db:5432/eft"


def test_the_secrets_file_round_trips_any_value_and_is_owner_only(tmp_path):
    values = {"EFT_DATABASE_URL": DB, "AWS_SECRET_ACCESS_KEY": PASSWORD + "\nnext line='x'"}
    path = credentials.write(tmp_path / "secrets.env", values)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert credentials.read(path) == values


def test_load_fills_only_what_the_environment_lacks(tmp_path, monkeypatch):
    path = credentials.write(tmp_path / "s.env", {"AWS_ACCESS_KEY_ID": "from-file", "HF_TOKEN": "hf-file"})
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "from-node")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv(credentials.FILE_VAR, str(path))
    assert credentials.load() == ["HF_TOKEN"]
    assert os.environ["AWS_ACCESS_KEY_ID"] == "from-node" and os.environ["HF_TOKEN"] == "hf-file"
    monkeypatch.delenv("HF_TOKEN")
    assert credentials.load(tmp_path / "missing.env") == []


def test_the_drivers_runtime_environment_carries_no_credential(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio:9000")
    monkeypatch.setenv(credentials.FILE_VAR, str(tmp_path / "s.env"))
    env = Settings(home=tmp_path, database_url=DB, admin_api_key="admin-key-value").driver_environment()
    text = repr(env)
    for secret in ("aws-secret-value", "admin-key-value", "%24%24"):
        assert secret not in text, secret
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"  # not a secret: it travels
    assert env["EFT_DATABASE_URL_REDACTED"] == "postgresql+psycopg://eft:***@db:5432/eft"
    assert env[credentials.FILE_VAR] == str(tmp_path / "s.env")


def test_a_serve_apps_environment_keeps_paths_and_moves_secrets_to_the_file(tmp_path):
    env = {"EFT_HOME": str(tmp_path), "EFT_DATABASE_URL": DB, "EFT_ADMIN_API_KEY": "k", "EFT_PORT": "8000"}
    public = credentials.public_env(env, tmp_path)
    assert public == {"EFT_HOME": str(tmp_path), "EFT_PORT": "8000",
                      credentials.FILE_VAR: str(tmp_path / "secrets.env")}
    assert credentials.read(tmp_path / "secrets.env") == {"EFT_DATABASE_URL": DB, "EFT_ADMIN_API_KEY": "k"}
    assert credentials.public_env({"EFT_HOME": str(tmp_path)}, tmp_path) == {"EFT_HOME": str(tmp_path)}
