"""The `eft` command line against a fake server: `eft.cli.output.make_client` is replaced by a client whose
transport is an httpx.MockTransport, so no service runs and nothing sleeps.

Run: .venv/bin/python -m pytest tests/unit/client/test_cli.py -q
"""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Callable

import httpx
import pytest
from typer.testing import CliRunner

import eft
from eft import Client
from eft.cli import main as cli
from eft.cli import output

runner = CliRunner()


def job_json(job_id: str = "ftjob-1", status: str = "queued", step: int = 0, **extra) -> dict:
    return {
        "id": job_id, "status": status, "model": "tiny-llama",
        "training_file": "data/train.jsonl", "method": {"type": "lora"}, "hyperparameters": {},
        "scaling": {}, "strategy": "auto", "checkpoint": {},
        "created_at": "2025-01-01T00:00:00Z", "step": step, "total_steps": 10, **extra,
    }


class FakeServer:
    """Routes (method, path) to a response or a function of the request; records requests."""

    def __init__(self, routes: dict[tuple[str, str], httpx.Response | Callable]):
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.routes.get((request.method, request.url.path))
        if answer is None:
            body = {"error": {"type": "not_found", "code": "job_not_found",
                              "message": f"no job at {request.url.path}"}}
            return httpx.Response(404, json=body, headers={"x-request-id": "req_404"})
        return answer(request) if callable(answer) else answer


@pytest.fixture
def serve(monkeypatch):
    """Install a FakeServer behind the CLI; returns a function taking the routes."""

    def install(routes: dict) -> FakeServer:
        server = FakeServer(routes)

        def make_client(base_url, api_key) -> Client:
            http = httpx.Client(transport=httpx.MockTransport(server))
            return Client(base_url="http://eft.test", api_key=api_key, http_client=http,
                          max_retries=0, sleep=lambda s: None)

        monkeypatch.setattr(output, "make_client", make_client)
        return server

    return install


def invoke(*args: str):
    return runner.invoke(cli.app, list(args))


def test_jobs_create_json_sends_only_the_flags_given(serve):
    server = serve({("POST", "/jobs"): httpx.Response(201, json=job_json())})
    result = invoke("jobs", "create", "--model", "tiny-llama", "--training-file",
                    "data/train.jsonl", "--max-steps", "5", "--r", "16",
                    "--target-modules", "q_proj,v_proj", "--use-gpu", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["id"] == "ftjob-1"
    assert json.loads(server.requests[0].content) == {
        "model": "tiny-llama", "training_file": "data/train.jsonl",
        "method": {"type": "lora", "r": 16, "target_modules": ["q_proj", "v_proj"]},
        "hyperparameters": {"max_steps": 5}, "scaling": {"use_gpu": True},
    }
    assert "idempotency-key" in server.requests[0].headers


def test_jobs_create_sends_the_priority_and_get_shows_the_queue(serve):
    queue = {"position": 3, "reason": "4 jobs run, the cluster's limit", "estimated_start": "2025-01-01T01:00:00Z"}
    server = serve({("POST", "/jobs"): httpx.Response(201, json=job_json(priority=90)),
                    ("GET", "/jobs/ftjob-1"): httpx.Response(200, json=job_json(priority=90, queue=queue))})
    assert invoke("jobs", "create", "--model", "m", "--training-file", "t.jsonl", "--priority", "90",
                  "--json").exit_code == 0
    assert json.loads(server.requests[0].content)["priority"] == 90
    assert invoke("jobs", "create", "--model", "m", "--training-file", "t.jsonl", "--priority", "high",
                  "--json").exit_code == 0
    assert json.loads(server.requests[1].content)["priority"] == "high"
    result = invoke("jobs", "get", "ftjob-1")
    assert result.exit_code == 0, result.output
    assert "#3: 4 jobs run, the cluster's limit" in result.output


def test_jobs_create_flags_override_the_request_file(serve, tmp_path):
    server = serve({("POST", "/jobs"): httpx.Response(201, json=job_json())})
    request = tmp_path / "request.json"
    request.write_text(json.dumps({"model": "tiny-llama", "training_file": "a.jsonl",
                                   "method": {"type": "lora", "r": 4},
                                   "hyperparameters": {"max_steps": 9, "seed": 1}}))
    result = invoke("jobs", "create", "--file", str(request), "--max-steps", "3",
                    "--method", "full", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(server.requests[0].content) == {
        "model": "tiny-llama", "training_file": "a.jsonl", "method": {"type": "full"},
        "hyperparameters": {"max_steps": 3, "seed": 1},
    }


def test_jobs_create_invalid_request_is_a_usage_error(serve):
    server = serve({})
    result = invoke("jobs", "create", "--model", "m", "--training-file", "t.jsonl",
                    "--micro-batch-size", "16", "--global-batch-size", "8")
    assert result.exit_code == 2
    assert "must not exceed global_batch_size (8)" in result.output
    assert server.requests == []


def test_jobs_create_shows_every_problem_the_server_reports(serve):
    body = {"error": {"type": "invalid_request_error", "code": "invalid_request",
                      "message": "2 problems", "errors": [
                          {"param": "model", "code": "unknown_model", "message": "no model m"},
                          {"param": "training_file", "code": "not_found", "message": "no file"}]}}
    serve({("POST", "/jobs"): httpx.Response(422, json=body)})
    result = invoke("jobs", "create", "--model", "m", "--training-file", "t.jsonl")
    assert result.exit_code == 2  # a refused request, like a bad flag
    assert "no model m" in result.stderr and "no file" in result.stderr and result.stdout == ""


def test_jobs_list_prints_a_table_and_json(serve):
    page = {"data": [job_json("ftjob-a", "running"), job_json("ftjob-b", "succeeded")],
            "has_more": True, "next_cursor": "cur-2"}
    server = serve({("GET", "/jobs"): httpx.Response(200, json=page)})
    result = invoke("jobs", "list", "--limit", "2", "--status", "running")
    assert result.exit_code == 0, result.output
    assert "ftjob-a" in result.stdout and "ftjob-b" in result.stdout and "cur-2" in result.stdout
    assert dict(server.requests[0].url.params) == {"limit": "2", "status": "running"}

    result = invoke("jobs", "list", "--json")
    assert [j["id"] for j in json.loads(result.stdout)["data"]] == ["ftjob-a", "ftjob-b"]


def test_jobs_get_404_exits_1_with_the_message(serve):
    serve({})
    result = invoke("jobs", "get", "ftjob-missing")
    assert result.exit_code == 1
    assert "no job at /jobs/ftjob-missing" in result.output and "req_404" in result.output

    result = invoke("jobs", "get", "ftjob-missing", "--json")
    assert result.exit_code == 1 and result.stdout == ""
    assert json.loads(result.stderr)["error"]["code"] == "job_not_found"


def test_jobs_get_and_cancel_show_the_job(serve):
    serve({("GET", "/jobs/ftjob-1"): httpx.Response(200, json=job_json()),
           ("POST", "/jobs/ftjob-1/cancel"): httpx.Response(200, json=job_json(status="cancelling"))})
    assert "tiny-llama" in invoke("jobs", "get", "ftjob-1").stdout
    result = invoke("jobs", "cancel", "ftjob-1", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["status"] == "cancelling"


def test_jobs_pause_and_resume_show_the_job(serve):
    serve({("POST", "/jobs/ftjob-1/pause"): httpx.Response(200, json=job_json(status="pausing")),
           ("POST", "/jobs/ftjob-1/resume"): httpx.Response(200, json=job_json(status="queued"))})
    result = invoke("jobs", "pause", "ftjob-1", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["status"] == "pausing"
    result = invoke("jobs", "resume", "ftjob-1")
    assert result.exit_code == 0 and "queued" in result.stdout


def test_jobs_events_table(serve):
    event = {"id": 3, "job_id": "ftjob-1", "created_at": "2025-01-01T00:00:00Z",
             "type": "worker_group_resized", "message": "grew to 2 workers"}
    serve({("GET", "/jobs/ftjob-1/events"): httpx.Response(200, json={"data": [event],
                                                                       "has_more": False})})
    result = invoke("jobs", "events", "ftjob-1")
    assert result.exit_code == 0 and "grew to 2 workers" in result.stdout


def waiting_routes(final: str) -> dict:
    statuses = iter(["running", final])
    metric = {"step": 10, "created_at": "2025-01-01T00:00:00Z",
              "values": {"loss": 0.25, "tokens_per_s": 1234.0}}
    return {
        ("GET", "/jobs/ftjob-1"): lambda r: httpx.Response(
            200, json=job_json(status=next(statuses), step=10)),
        ("GET", "/jobs/ftjob-1/metrics"): httpx.Response(200, json={"data": [metric]}),
    }


@pytest.mark.parametrize("final, exit_code", [("succeeded", 0), ("failed", 1), ("cancelled", 1)])
def test_jobs_wait_exit_code_follows_the_final_status(serve, final, exit_code):
    serve(waiting_routes(final))
    result = invoke("jobs", "wait", "ftjob-1")
    assert result.exit_code == exit_code, result.output
    assert final in result.stdout


def test_jobs_wait_json_prints_only_the_final_job(serve):
    serve(waiting_routes("succeeded"))
    result = invoke("jobs", "wait", "ftjob-1", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["status"] == "succeeded"


def test_jobs_create_wait(serve):
    routes = waiting_routes("failed")
    routes[("POST", "/jobs")] = httpx.Response(201, json=job_json())
    serve(routes)
    result = invoke("jobs", "create", "--model", "m", "--training-file", "t.jsonl", "--wait",
                    "--json")
    assert result.exit_code == 1 and json.loads(result.stdout)["status"] == "failed"


def test_up_and_down_call_service_local(monkeypatch):
    local = types.SimpleNamespace(
        # The real `up` resolves no port to EFT_PORT (8000 by default).
        up=lambda port, num_cpus: {"service_url": f"http://127.0.0.1:{port or 'EFT_PORT'}",
                                   "dashboard_url": "http://127.0.0.1:8265", "started_ray": True},
        down=lambda: {"stopped_service": True, "stopped_ray": False},
    )
    monkeypatch.setitem(sys.modules, "eft.api.local", local)
    result = invoke("up", "--port", "8123", "--num-cpus", "2")
    assert result.exit_code == 0 and "http://127.0.0.1:8265" in result.stdout
    assert json.loads(invoke("up", "--json").stdout)["service_url"] == "http://127.0.0.1:EFT_PORT"
    assert json.loads(invoke("down", "--json").stdout) == {"stopped_service": True,
                                                           "stopped_ray": False}


def test_every_command_in_the_table_is_registered_with_json():
    for name in cli.COMMANDS:
        result = invoke(*name.split(), "--help")
        assert result.exit_code == 0 and "--json" in result.output, name


def test_version_and_shell_completion():
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"eft {eft.__version__}"
    assert "--install-completion" in invoke("--help").stdout


def test_piped_tables_keep_long_ids_whole(serve):
    long_id = "ftjob-" + "0123456789abcdef" * 6
    page = {"data": [job_json(long_id, "running")], "has_more": False, "next_cursor": None}
    serve({("GET", "/jobs"): httpx.Response(200, json=page)})
    result = invoke("jobs", "list")
    assert result.exit_code == 0 and long_id in result.stdout.splitlines()[1]


def test_files_delete_download_and_job_checkpoints(serve, tmp_path, monkeypatch):
    checkpoint = {"step": 4, "attempt": 1, "path": "/ckpt/ftjob-1/checkpoint_000000", "reason": "interval",
                  "world_size": 2, "available": True, "created_at": "2025-01-01T00:00:00Z"}
    serve({
        ("DELETE", "/files/file-1"): httpx.Response(200, json={"id": "file-1", "object": "file", "deleted": True}),
        ("GET", "/files/file-1/content"): httpx.Response(200, content=b'{"x": 1}\n'),
        ("GET", "/files/file-1"): httpx.Response(200, json={
            "id": "file-1", "bytes": 9, "created_at": 1, "filename": "train.jsonl", "purpose": "fine-tune",
            "sha256": "ab"}),
        ("GET", "/jobs/ftjob-1/checkpoints"): httpx.Response(200, json={"object": "list", "data": [checkpoint]}),
    })
    assert "deleted file-1" in invoke("files", "delete", "file-1").stdout
    monkeypatch.chdir(tmp_path)
    result = invoke("files", "download", "file-1", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["path"] == "train.jsonl"
    assert (tmp_path / "train.jsonl").read_bytes() == b'{"x": 1}\n'
    assert invoke("files", "download", "file-1", "-o", "-").stdout == '{"x": 1}\n'
    result = invoke("jobs", "checkpoints", "ftjob-1")
    assert result.exit_code == 0 and "/ckpt/ftjob-1/checkpoint_000000" in result.stdout and "interval" in result.stdout
    assert json.loads(invoke("jobs", "checkpoints", "ftjob-1", "--json").stdout)["data"][0]["step"] == 4
