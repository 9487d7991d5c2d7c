"""Fixtures of every tier: an isolated EFT_HOME per test, the job-store databases under test, and the
process's one local Ray. Shared code lives in tests/helpers/; the tiers and their budgets in
tests/budgets.toml."""

from __future__ import annotations

import pytest

from eft.service.settings import get_settings
from tests.helpers.cluster import local_ray
from tests.helpers.databases import postgres_schema_url


@pytest.fixture
def eft_home(tmp_path, monkeypatch):
    """A fresh EFT_HOME with a `data/` root; settings are re-read from the environment."""
    home = tmp_path / "eft-home"
    (home / "data").mkdir(parents=True)
    monkeypatch.setenv("EFT_HOME", str(home))
    monkeypatch.delenv("EFT_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    yield home
    get_settings.cache_clear()


@pytest.fixture(scope="session")
def ray_cluster():
    """The local Ray cluster of this test process (tests/helpers/cluster.py), started by the
    first test that asks for it: its dashboard and Prometheus URLs."""
    yield from local_ray()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request, tmp_path):
    """A job-store URL: a SQLite file, or a throwaway schema on the local PostgreSQL."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jobs.db'}"
        return
    with postgres_schema_url("eft_test") as url:
        yield url
