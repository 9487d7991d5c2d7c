"""`eft jobs logs`, `eft jobs plot` and `eft jobs watch` against a fake server.

Run: .venv/bin/python -m pytest tests/unit/client/test_cli_monitor.py -q
"""

from __future__ import annotations

import httpx

from tests.unit.client.test_cli import job_json, runner, serve  # noqa: F401 - the fixture
from eft.cli import main as cli


def test_logs_prints_the_attempts_text_and_sends_the_key(serve, monkeypatch):  # noqa: F811
    monkeypatch.setenv("EFT_API_KEY", "sk-test")
    server = serve({("GET", "/jobs/ftjob-1/logs"): httpx.Response(200, json={
        "object": "fine_tuning.job.logs", "job_id": "ftjob-1", "attempt": 2,
        "ray_submission_id": "ftjob-1-attempt-2", "data": "line one\nline two\n"})})
    result = runner.invoke(cli.app, ["jobs", "logs", "ftjob-1", "--attempt", "2", "--tail", "5"])
    assert result.exit_code == 0, result.output
    assert result.output == "line one\nline two\n"
    request = server.requests[0]
    assert request.url.params["attempt"] == "2" and request.url.params["tail"] == "5"
    assert request.headers["authorization"] == "Bearer sk-test"


def test_logs_follow_prints_streamed_lines_until_the_end_event(serve):  # noqa: F811
    stream = ('event: attempt\ndata: {"attempt": 1}\n\ndata: step 1\n\n: waiting\n\n'
              'data: step 2\n\nevent: end\ndata: {"status": "succeeded"}\n\n')
    server = serve({("GET", "/jobs/ftjob-1/logs"): httpx.Response(
        200, text=stream, headers={"content-type": "text/event-stream"})})
    result = runner.invoke(cli.app, ["jobs", "logs", "ftjob-1", "--follow"])
    assert result.exit_code == 0, result.output
    assert result.output == "step 1\nstep 2\n"
    assert server.requests[0].url.params["follow"] == "true"


def test_logs_of_a_job_not_started_exits_1_with_the_message(serve):  # noqa: F811
    serve({("GET", "/jobs/ftjob-1/logs"): httpx.Response(409, json={"error": {
        "type": "invalid_request_error", "code": "logs_not_available", "param": "job_id",
        "message": "job ftjob-1 is queued and has not started on Ray yet"}})})
    for args in (["jobs", "logs", "ftjob-1"], ["jobs", "logs", "ftjob-1", "-f"]):
        result = runner.invoke(cli.app, args)
        assert result.exit_code == 1 and "has not started on Ray yet" in result.output


def test_plot_writes_the_png_and_refuses_a_job_without_losses(serve, tmp_path):  # noqa: F811
    metrics = {"object": "list", "data": [
        {"step": s, "created_at": "2025-01-01T00:00:00Z", "values": {"loss": 3.0 / s}} for s in (1, 2, 3)]}
    serve({("GET", "/jobs/ftjob-1"): httpx.Response(200, json=job_json(status="running", step=3)),
           ("GET", "/jobs/ftjob-1/metrics"): httpx.Response(200, json=metrics)})
    out = tmp_path / "curve.png"
    result = runner.invoke(cli.app, ["jobs", "plot", "ftjob-1", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert '"path"' in result.output

    serve({("GET", "/jobs/ftjob-1"): httpx.Response(200, json=job_json()),
           ("GET", "/jobs/ftjob-1/metrics"): httpx.Response(200, json={"object": "list", "data": []})})
    result = runner.invoke(cli.app, ["jobs", "plot", "ftjob-1", "-o", str(tmp_path / "none.png")])
    assert result.exit_code == 1 and "no loss yet" in result.output
    assert not (tmp_path / "none.png").exists()


def test_watch_follows_to_the_end_with_step_and_loss(serve):  # noqa: F811
    metrics = {"object": "list", "data": [
        {"step": 10, "created_at": "2025-01-01T00:00:00Z", "values": {"loss": 0.5, "tokens_per_s": 900.0}}]}
    serve({("GET", "/jobs/ftjob-1"): httpx.Response(200, json=job_json(status="succeeded", step=10)),
           ("GET", "/jobs/ftjob-1/metrics"): httpx.Response(200, json=metrics)})
    result = runner.invoke(cli.app, ["jobs", "watch", "ftjob-1"])
    assert result.exit_code == 0, result.output
    assert "succeeded" in result.output and "loss 0.5000" in result.output
