"""The launcher's submit against a cluster whose job agent is not up yet (pure logic: the Ray
Jobs client is a stand-in that refuses as Ray's dashboard does)."""

from __future__ import annotations

import pytest

from eft.service.runs import launcher as launcher_module
from eft.service.runs.launcher import NO_AGENT, RayJobsLauncher
from eft.service.settings import Settings


class RefusingClient:
    """Answers `refusals` submits with `error`, then accepts."""

    def __init__(self, refusals: int, error: str):
        self.refusals, self.error, self.calls = refusals, error, []

    def submit_job(self, **kwargs) -> str:
        self.calls.append(kwargs["submission_id"])
        if len(self.calls) <= self.refusals:
            raise RuntimeError(f"Request failed with status code 503: {self.error}")
        return kwargs["submission_id"]


def _launcher(client: RefusingClient, monkeypatch) -> tuple[RayJobsLauncher, list[float]]:
    slept: list[float] = []
    monkeypatch.setattr(launcher_module.time, "sleep", slept.append)
    launcher = RayJobsLauncher(Settings())
    launcher._client = client
    return launcher, slept


def test_a_cluster_without_a_job_agent_yet_is_waited_for(monkeypatch):
    client = RefusingClient(3, f"{NO_AGENT}, please try again later.")
    launcher, slept = _launcher(client, monkeypatch)
    assert launcher.submit("ftjob-a", 1, "a") is True
    assert client.calls == ["ftjob-a-attempt-1"] * 4
    assert slept == [0.5, 1.0, 2.0]  # backing off


def test_the_wait_for_an_agent_is_bounded(monkeypatch):
    client = RefusingClient(10_000, NO_AGENT)
    launcher, slept = _launcher(client, monkeypatch)
    clock = iter(range(0, 10_000, 5))  # every look at the clock 5 s later
    monkeypatch.setattr(launcher_module.time, "monotonic", lambda: float(next(clock)))
    with pytest.raises(RuntimeError, match=NO_AGENT):
        launcher.submit("ftjob-b", 1, None)
    assert 1 < len(client.calls) <= launcher_module.AGENT_WAIT_S / 5 + 1


def test_other_refusals_are_not_retried(monkeypatch):
    client = RefusingClient(1, "runtime_env is invalid")
    launcher, slept = _launcher(client, monkeypatch)
    with pytest.raises(RuntimeError, match="runtime_env is invalid"):
        launcher.submit("ftjob-c", 1, None)
    assert len(client.calls) == 1 and slept == []
    already = RefusingClient(1, "Job with submission_id ftjob-d-attempt-1 already exists")
    launcher, _ = _launcher(already, monkeypatch)
    assert launcher.submit("ftjob-d", 1, None) is False
