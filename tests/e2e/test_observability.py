"""Seeing a job: one small job on the shared service, watched through every window we offer:
Ray's Prometheus endpoint (training metrics labelled with the job id), the service's /metrics,
the driver's logs from Ray Jobs (JSON and server-sent events), `eft jobs plot`, and /ui
rendered in headless Chromium (screenshot under test-artifacts/)."""

from __future__ import annotations

import contextlib
import html
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from tests.e2e.conftest import _free_port, api, as_json, client, wait_for

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
JOB = {
    "model": "tiny-llama",
    "training_file": "demo/chat_train.jsonl",
    "validation_file": "demo/chat_valid.jsonl",
    "method": {"type": "lora", "r": 4, "alpha": 8, "dropout": 0.0},
    "hyperparameters": {"max_steps": 16, "learning_rate": 3e-3, "global_batch_size": 8,
                        "micro_batch_size": 4, "max_seq_len": 96, "log_every_steps": 1},
    "scaling": {"min_workers": 1},
    "checkpoint": {"every_steps": 8, "keep": 1},
    "name": "e2e-observe",
    "trackers": {"tensorboard": True, "mlflow": True},
}
#: Training series the job must show on Ray's endpoint while it runs.
TRAINING_SERIES = {"ray_eft_train_loss", "ray_eft_train_learning_rate", "ray_eft_train_tokens_per_second",
                   "ray_eft_train_samples_per_second", "ray_eft_train_step_time_seconds",
                   "ray_eft_train_mfu", "ray_eft_train_peak_memory_bytes", "ray_eft_train_world_size",
                   "ray_eft_train_step", "ray_eft_train_tokens_total", "ray_eft_train_checkpoints_total",
                   "ray_eft_train_checkpoint_size_bytes", "ray_eft_train_eval_loss"}


def _scrape(url: str) -> list:
    text = api.get(url, timeout=10).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


class RaySeries(threading.Thread):
    """Scrapes Ray's endpoint every second while the job runs (gauges of a finished job's
    processes age out within seconds), keeping each series of our job id."""

    def __init__(self, url: str, job_id: str):
        super().__init__(daemon=True)
        self.url, self.job_id = url, job_id
        self.seen: dict[str, dict] = {}
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                for s in _scrape(self.url):
                    if s.labels.get("job_id") == self.job_id:
                        self.seen[s.name] = {"labels": s.labels, "value": s.value}
            except Exception:  # noqa: BLE001 - the endpoint may not answer yet; keep polling
                pass
            self.done.wait(1.0)


@pytest.fixture(scope="module")
def watched_job(service):
    url = service["url"]
    job_id = client(url).jobs.create(JOB).id
    series = RaySeries(service["ray_metrics_url"], job_id)
    series.start()
    done = wait_for(job_id, url, {"succeeded"})
    # Every series is exported within a second of being set; give the last ones a moment.
    deadline = time.monotonic() + 10
    while not TRAINING_SERIES <= set(series.seen) and time.monotonic() < deadline:
        time.sleep(0.5)
    series.done.set()
    series.join(5)
    return {"job": done, "series": series.seen, "url": url, "home": service["home"]}


def test_rays_endpoint_exposes_the_jobs_training_metrics(watched_job):
    seen, job = watched_job["series"], watched_job["job"]
    missing = TRAINING_SERIES - set(seen)
    assert not missing, f"not on Ray's endpoint: {missing}; seen: {sorted(seen)}"
    labels = seen["ray_eft_train_loss"]["labels"]
    assert labels["tenant"] == "default" and labels["job_name"] == "e2e-observe"
    assert 0 < seen["ray_eft_train_loss"]["value"] < 20
    assert seen["ray_eft_train_world_size"]["value"] == 1
    assert 0 < seen["ray_eft_train_mfu"]["value"] < 1
    assert 1 <= seen["ray_eft_train_step"]["value"] <= job["total_steps"]


def test_job_reports_progress_and_trained_tokens(watched_job):
    job = watched_job["job"]
    assert job["progress"] == 1.0 and job["estimated_finish"] is None
    assert job["trained_tokens"] > 0


def test_service_metrics_parse_with_request_and_job_status_values(watched_job):
    url, job_id = watched_job["url"], watched_job["job"]["id"]

    def samples() -> dict:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in _scrape(f"{url}/metrics")}

    key = ("eft_http_requests_total", (("method", "GET"), ("route", "/jobs/{job_id}"), ("status", "200")))
    before = samples()
    for _ in range(3):
        assert api.get(f"{url}/jobs/{job_id}").status_code == 200
    after = samples()
    assert after[key] - before.get(key, 0) == 3
    # Jobs by status match the store, as the API lists it.
    deadline = time.monotonic() + 30
    while True:
        listed = {s: len(client(url).jobs.list(limit=100, status=s).data)
                  for s in ("succeeded", "failed", "queued", "running")}
        exported = {s: samples()[("eft_jobs", (("status", s),))] for s in listed}
        if exported == listed or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert exported == listed and exported["succeeded"] >= 1
    assert samples()[("eft_queue_depth", ())] == listed["queued"]
    assert after[("eft_job_dispatch_seconds_count", (("outcome", "submitted"),))] >= 1
    assert after[("eft_job_validation_seconds_count", (("outcome", "queued"),))] >= 1


def test_logs_return_the_drivers_lines_whole_and_streamed(watched_job):
    url, job_id = watched_job["url"], watched_job["job"]["id"]
    logs = as_json(client(url).jobs.logs(job_id))
    assert logs["ray_submission_id"] == f"{job_id}-attempt-1"
    driver_lines = [json.loads(line) for line in logs["data"].splitlines()
                    if line.startswith("{") and '"logger": "eft.driver"' in line]
    assert any(r["job_id"] == job_id and r["attempt"] == 1 and "succeeded" in r["message"]
               for r in driver_lines), logs["data"][-3000:]
    with api.stream("GET", f"{url}/jobs/{job_id}/logs", params={"follow": "true"}, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        streamed = list(r.iter_lines())
    assert "event: end" in streamed and any(job_id in line and "succeeded" in line for line in streamed)
    # The client reads the same stream: every line, until the end event.
    followed = list(client(url).jobs.follow_logs(job_id))
    assert any(job_id in line and "succeeded" in line for line in followed)


def test_eft_jobs_plot_writes_a_png(watched_job, tmp_path):
    from eft.cli import app

    out = tmp_path / "loss.png"
    key = (api.headers.get("authorization") or "").removeprefix("Bearer ")
    args = ["--base-url", watched_job["url"], *(["--api-key", key] if key else []),
            "jobs", "plot", watched_job["job"]["id"], "-o", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (800, 450)


CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1280,1500"]


def _chromium_when(url: str, condition: str, timeout_s: float = 180) -> str:
    """The page's HTML once the JavaScript `condition` holds, read over the DevTools protocol."""
    from websockets.sync.client import connect

    port = _free_port()
    # Chromium's helper processes may still be writing the profile as the browser exits: the
    # whole process group is stopped, and a file they leave behind does not fail the test.
    with tempfile.TemporaryDirectory(prefix="eft-chromium-", ignore_cleanup_errors=True) as profile:
        browser = subprocess.Popen([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
                                    f"--remote-debugging-port={port}", "--remote-allow-origins=*", url],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout_s
            pages = []
            while not pages:
                assert time.monotonic() < deadline, "chromium never listed the page"
                try:
                    pages = [t for t in api.get(f"http://127.0.0.1:{port}/json/list", timeout=5).json()
                             if t["type"] == "page"]
                except Exception:  # noqa: BLE001 - not listening yet
                    time.sleep(0.2)
            with connect(pages[0]["webSocketDebuggerUrl"], max_size=None) as ws:
                calls = iter(range(1, 1_000_000))

                def evaluate(expression: str):  # noqa: ANN202
                    n = next(calls)
                    ws.send(json.dumps({"id": n, "method": "Runtime.evaluate",
                                        "params": {"expression": expression, "returnByValue": True}}))
                    while (reply := json.loads(ws.recv(timeout=timeout_s))).get("id") != n:
                        pass
                    return reply["result"]["result"].get("value")

                while not evaluate(f"Boolean(document.readyState === 'complete' && ({condition}))"):
                    assert time.monotonic() < deadline, f"the page never got to: {condition}"
                    time.sleep(0.2)
                return evaluate("document.documentElement.outerHTML")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(browser.pid, signal.SIGTERM)
            browser.wait(timeout=30)


def _chromium(*args: str) -> str:
    with tempfile.TemporaryDirectory(prefix="eft-chromium-", ignore_cleanup_errors=True) as profile:
        result = subprocess.run(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--virtual-time-budget=15000", *args],
            capture_output=True, text=True, timeout=120,
        )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_ui_renders_the_job_list_and_a_job_page_with_a_chart(watched_job):
    url, job = watched_job["url"], watched_job["job"]
    key = (api.headers.get("authorization") or "").removeprefix("Bearer ")
    fragment = f"#key={key}" if key else ""
    listing = _chromium("--dump-dom", f"{url}/ui{fragment}")
    assert f'data-job-id="{job["id"]}"' in listing and "e2e-observe" in listing
    page_url = f"{url}/ui/jobs/{job['id']}{fragment}"
    page = _chromium("--dump-dom", page_url)
    points = sum("loss" in row.values for row in client(url).jobs.metrics(job["id"]))
    assert points == job["total_steps"] and f'data-points="{points}"' in page
    assert page.count("<canvas") >= 2 and 'data-status="succeeded"' in page
    assert f'"job_id": "{job["id"]}"' in page  # the manifest was rendered
    # An admin's page links to Ray's dashboard (GET /me names it to admins only).
    assert "Ray dashboard" in page and "/#/jobs/" in page
    # Replies to validation prompts at each evaluation (step 8 and the end), and each
    # checkpoint's validation loss.
    assert page.count("<tr><td>8</td>") >= 3 and page.count("<tr><td>16</td>") >= 3
    # The chat box: `?chat=` sends a message to the base and the fine-tuned model side by side,
    # streamed from the model servers; each answer is what /v1 gives for the same request.
    from openai import OpenAI

    from tests.e2e.conftest import ADMIN_KEY

    message = "What is the first word of: frog fox high king"
    # A streamed body does not hold Chromium's virtual clock as a pending fetch does: this page
    # is read over the DevTools protocol once both columns say they are done.
    chatted = _chromium_when(f"{url}/ui/jobs/{job['id']}?chat={quote(message)}&max_tokens=16{fragment}",
                             "['chat-base', 'chat-tuned'].every(id => document.getElementById(id).dataset.done"
                             " || document.getElementById(id).dataset.error)")
    openai = OpenAI(base_url=f"{url}/v1", api_key=ADMIN_KEY, max_retries=0, timeout=300)
    for model, element in ((job["model"], "chat-base"), (job["fine_tuned_model"], "chat-tuned")):
        expected = openai.chat.completions.create(model=model, messages=[{"role": "user", "content": message}],
                                                  max_tokens=16, temperature=0).choices[0].message.content
        shown = re.search(rf'<pre id="{element}"[^>]*data-done="1"[^>]*>(.*?)</pre>', chatted, re.S)
        assert shown and shown.group(1) == html.escape(expected, quote=False), (element, expected)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "ui-job.png"
    _chromium(f"--screenshot={shot}", page_url)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tensorboard_event_files_land_in_the_artifact(watched_job):
    runs = Path(watched_job["job"]["artifact_path"]) / "tensorboard" / "attempt-1"
    files = list(runs.glob("events.out.tfevents.*"))
    assert len(files) == 1
    data = files[0].read_bytes()
    assert b"train/loss" in data and b"eval/loss" in data


def test_mlflow_run_in_the_services_file_store(watched_job):
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    job = watched_job["job"]
    client = MlflowClient(tracking_uri=(Path(watched_job["home"]) / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("eft-default")
    (run,) = client.search_runs([experiment.experiment_id], f"tags.`eft.job_id` = '{job['id']}'")
    history = client.get_metric_history(run.info.run_id, "loss")
    assert len(history) == job["total_steps"] and run.info.status == "FINISHED"
