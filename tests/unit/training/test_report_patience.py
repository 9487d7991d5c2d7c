"""A report from a Train controller callback outlives a short job-store outage, and a long one
is dropped with a log rather than failing the controller (which would cost the job a restart)."""

from __future__ import annotations

from eft.training import controller as driver
from eft.training.reporting import RunSpec


class Outage(Exception):
    pass


def _reporting():
    return driver._Reporting(reporter=None, spec=RunSpec(job_id="ftjob-x", attempt=1, tenant="t", name=None), config={})


def test_a_report_is_retried_through_a_short_outage(monkeypatch):
    monkeypatch.setattr(driver.time, "sleep", lambda s: None)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise Outage("connection refused")
        return "recorded"

    assert _reporting().report("checkpoint", flaky) == "recorded"
    assert len(calls) == 3


def test_a_long_outage_drops_the_report_without_raising(monkeypatch, caplog):
    clock = iter(range(0, 10_000, 5))  # each look at the clock is 5 s later
    monkeypatch.setattr(driver.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(driver.time, "sleep", lambda s: None)

    def down():
        raise Outage("connection refused")

    with caplog.at_level("WARNING", logger="eft.driver"):
        assert _reporting().report("checkpoint", down) is None
    assert "dropped" in caplog.text


def test_a_report_that_works_is_made_once():
    calls = []
    assert _reporting().report("event", lambda: calls.append(1) or True) is True
    assert calls == [1]
