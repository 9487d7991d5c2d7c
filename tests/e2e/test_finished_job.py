"""Journey: a job from request to model, over real HTTP: Ray Serve -> scheduler -> Ray Job -> Ray
Train (2 workers) -> adapter on disk, then everything a user sees of it, all on that one job: the
adapter loaded back with plain PEFT in a fresh process, its manifest, metrics, events and
checkpoints; Ray's Prometheus endpoint (training metrics labelled with the job id) and the
service's /metrics; the driver's logs from Ray Jobs (JSON and server-sent events); `eft jobs
plot`; /ui rendered in headless Chromium with its chat box (screenshot under test-artifacts/);
TensorBoard and MLflow.

The job is posted with every other job of the e2e tier at once (tests/e2e/conftest.py:journey).
"""

from __future__ import annotations

import html
import json
import re
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from typer.testing import CliRunner

from tests.helpers.budgets import machine_factor
from tests.helpers.browser import chromium, chromium_when
from tests.helpers.metrics import TRAINING_SERIES, scrape
from tests.helpers.paths import DEMO_DATA, REPO, TINY_LLAMA
from tests.helpers.service_api import api, as_json, client, wait_for

ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def finished(journey, service):
    """The journey's LoRA job once it succeeded, with what Ray's endpoint showed of it while it ran."""
    url = service["url"]
    done = wait_for(journey.jobs["lora"]["id"], url, {"succeeded"})
    series = journey.series
    # Every series is exported within a second of being set; give the last ones a moment.
    deadline = time.monotonic() + 10 * machine_factor()
    while not TRAINING_SERIES <= set(series.seen) and time.monotonic() < deadline:
        time.sleep(0.5)
    series.done.set()
    series.join(5)
    return {"job": done, "series": series.seen, "url": url, "home": service["home"]}


LOAD_IN_FRESH_PROCESS = textwrap.dedent("""
    import json, sys, torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    base_dir, adapter_dir, valid = sys.argv[1:4]
    tok = AutoTokenizer.from_pretrained(adapter_dir)
    rows = [json.loads(l) for l in open(valid)][:32]
    def loss(model):
        total, n = 0.0, 0
        for row in rows:
            out = tok.apply_chat_template(row["messages"], return_dict=True,
                                          return_assistant_tokens_mask=True, return_tensors="pt")
            labels = out["input_ids"].clone()
            labels[out["assistant_masks"] == 0] = -100
            with torch.no_grad():
                l = model(input_ids=out["input_ids"], labels=labels).loss
            k = int((labels[:, 1:] != -100).sum())
            total, n = total + float(l) * k, n + k
        return total / n
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    before = loss(base)
    tuned = PeftModel.from_pretrained(base, adapter_dir)
    print(json.dumps({"before": before, "after": loss(tuned),
                      "type": type(tuned).__name__, "modules": sorted(tuned.peft_config["default"].target_modules)}))
""")


def test_lora_job_over_http_produces_a_loadable_adapter(finished):
    url, job, done = finished["url"], finished["job"], finished["job"]
    assert done["attempt"] == 1 and done["num_workers"] == 2 and done["step"] == 12
    assert done["ray_submission_id"] == f"{job['id']}-attempt-1"
    artifact = Path(done["artifact_path"])
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json",
            "eft_manifest.json"} <= {p.name for p in artifact.iterdir()}

    manifest = json.loads((artifact / "eft_manifest.json").read_text())
    assert manifest["job_id"] == job["id"] and manifest["method"] == "lora"
    assert len(manifest["base_model"]["fingerprint_sha256"]) == 64
    assert len(manifest["datasets"]["training_file"]["sha256"]) == 64
    assert manifest["hyperparameters"]["global_batch_size"] == 16
    assert manifest["strategy"] == done["resolved"]["strategy"]  # planned: strategy was auto
    memory = manifest["memory_gb"]
    assert memory["predicted_per_worker"] > 0 and len(memory["measured_peak_per_worker"]) == 2
    assert all(m > 0.05 for m in memory["measured_peak_per_worker"])
    assert manifest["final_metrics"]["eval_loss"] == pytest.approx(done["result_metrics"]["eval_loss"])

    metrics = as_json(client(url).jobs.metrics(job["id"]))["data"]
    steps = [m for m in metrics if "loss" in m["values"]]
    assert [m["step"] for m in steps] == list(range(1, 13))
    assert all(m["values"]["world_size"] == 2 and m["values"]["tokens_per_s"] > 0 for m in steps)
    assert steps[-1]["values"]["loss"] < steps[0]["values"]["loss"]
    assert steps[0]["values"]["learning_rate"] < steps[2]["values"]["learning_rate"]  # warmup

    events = [e.type for e in client(url).jobs.list_events(job["id"])]
    for expected in ("created", "queued", "dispatched", "submitted", "training_started",
                     "checkpoint_saved", "succeeded"):
        assert expected in events
    assert events.index("queued") < events.index("dispatched") < events.index("succeeded")
    checkpoints = client(url).jobs.checkpoints(job["id"])
    assert [c.step for c in checkpoints] == [5, 10, 12]

    base_dir, valid = TINY_LLAMA, DEMO_DATA / "chat_valid.jsonl"
    out = subprocess.run([sys.executable, "-c", LOAD_IN_FRESH_PROCESS, str(base_dir), str(artifact), str(valid)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded["type"] == "PeftModelForCausalLM"
    assert loaded["after"] < loaded["before"] - 0.5, loaded


def test_rays_endpoint_exposes_the_jobs_training_metrics(finished):
    seen, job = finished["series"], finished["job"]
    missing = TRAINING_SERIES - set(seen)
    assert not missing, f"not on Ray's endpoint: {missing}; seen: {sorted(seen)}"
    labels = seen["ray_eft_train_loss"]["labels"]
    assert labels["tenant"] == "default" and labels["job_name"] == "e2e-lora"
    assert 0 < seen["ray_eft_train_loss"]["value"] < 20
    assert seen["ray_eft_train_world_size"]["value"] == 2
    assert 0 < seen["ray_eft_train_mfu"]["value"] < 1
    assert 1 <= seen["ray_eft_train_step"]["value"] <= job["total_steps"]


def test_job_reports_progress_and_trained_tokens(finished):
    job = finished["job"]
    assert job["progress"] == 1.0 and job["estimated_finish"] is None
    assert job["trained_tokens"] > 0


def test_service_metrics_parse_with_request_and_job_status_values(finished):
    url, job_id = finished["url"], finished["job"]["id"]

    def samples() -> dict:
        return {(s.name, tuple(sorted(s.labels.items()))): s.value for s in scrape(f"{url}/metrics")}

    key = ("eft_http_requests_total", (("method", "GET"), ("route", "/jobs/{job_id}"), ("status", "200")))
    before = samples()
    for _ in range(3):
        assert api.get(f"{url}/jobs/{job_id}").status_code == 200
    after = samples()
    assert after[key] - before.get(key, 0) == 3
    # Jobs by status match the store, as the API lists it.
    deadline = time.monotonic() + 30 * machine_factor()
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


def test_logs_return_the_drivers_lines_whole_and_streamed(finished):
    url, job_id = finished["url"], finished["job"]["id"]
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


def test_eft_jobs_plot_writes_a_png(finished, tmp_path):
    from eft.cli.main import app

    out = tmp_path / "loss.png"
    key = (api.headers.get("authorization") or "").removeprefix("Bearer ")
    args = ["--base-url", finished["url"], *(["--api-key", key] if key else []),
            "jobs", "plot", finished["job"]["id"], "-o", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (800, 450)


def test_ui_renders_the_job_list_and_a_job_page_with_a_chart(finished, ray_cluster):
    url, job = finished["url"], finished["job"]
    key = (api.headers.get("authorization") or "").removeprefix("Bearer ")
    fragment = f"#key={key}" if key else ""
    listing = chromium("--dump-dom", f"{url}/ui{fragment}")
    assert f'data-job-id="{job["id"]}"' in listing and "e2e-lora" in listing
    page_url = f"{url}/ui/jobs/{job['id']}{fragment}"
    page = chromium("--dump-dom", page_url)
    points = sum("loss" in row.values for row in client(url).jobs.metrics(job["id"]))
    assert points == job["total_steps"] and f'data-points="{points}"' in page
    assert page.count("<canvas") >= 2 and 'data-status="succeeded"' in page
    assert f'"job_id": "{job["id"]}"' in page  # the manifest was rendered
    # An admin's page links to Ray's dashboard (GET /me names it to admins only).
    assert "Ray dashboard" in page and "/#/jobs/" in page
    # Replies to validation prompts at each evaluation (each checkpoint: steps 5, 10 and the
    # end), and each kept checkpoint's validation loss.
    assert page.count("<tr><td>10</td>") >= 3 and page.count("<tr><td>12</td>") >= 3
    # The chat box: `?chat=` sends a message to the base and the fine-tuned model side by side,
    # streamed from the model servers; each answer is what /v1 gives for the same request.
    from openai import OpenAI

    from tests.helpers.service_api import ADMIN_KEY

    message = "What is the first word of: frog fox high king"
    # A streamed body does not hold Chromium's virtual clock as a pending fetch does: this page
    # is read over the DevTools protocol once both columns say they are done.
    chatted = chromium_when(f"{url}/ui/jobs/{job['id']}?chat={quote(message)}&max_tokens=16{fragment}",
                             "['chat-base', 'chat-tuned'].every(id => document.getElementById(id).dataset.done"
                             " || document.getElementById(id).dataset.error)")
    openai = OpenAI(base_url=f"{url}/v1", api_key=ADMIN_KEY, max_retries=0, timeout=300)
    for model, element in ((job["model"], "chat-base"), (job["fine_tuned_model"], "chat-tuned")):
        expected = openai.chat.completions.create(model=model, messages=[{"role": "user", "content": message}],
                                                  max_tokens=16, temperature=0).choices[0].message.content
        shown = re.search(rf'<pre id="{element}"[^>]*data-done="1"[^>]*>(.*?)</pre>', chatted, re.S)
        assert shown and shown.group(1) == html.escape(expected, quote=False), (element, expected)
    # The model servers' metrics on Ray's endpoint: the tokens of each model (and tenant), and the
    # time to the first token (the vLLM engine records them; Ray exports them every second).
    from tests.helpers.metrics import scrape

    deadline = time.monotonic() + 60
    while True:
        samples = scrape(ray_cluster["ray_metrics_url"])
        tokens = {s.labels.get("model"): s.value for s in samples if s.name == "ray_eft_serving_generated_tokens_total"}
        firsts = [s.value for s in samples if s.name == "ray_eft_serving_time_to_first_token_seconds_count"]
        # Ray exports each metric on its own schedule: wait until both show every chat above.
        if (tokens.get(job["fine_tuned_model"], 0) >= 16 and sum(firsts) >= 4) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert tokens.get(job["fine_tuned_model"], 0) >= 16 and sum(firsts) >= 4, (tokens, firsts)
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "ui-job.png"
    chromium(f"--screenshot={shot}", page_url)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tensorboard_event_files_land_in_the_artifact(finished):
    runs = Path(finished["job"]["artifact_path"]) / "tensorboard" / "attempt-1"
    files = list(runs.glob("events.out.tfevents.*"))
    assert len(files) == 1
    data = files[0].read_bytes()
    assert b"train/loss" in data and b"eval/loss" in data


def test_mlflow_run_in_the_services_file_store(finished):
    import os

    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    job = finished["job"]
    client = MlflowClient(tracking_uri=(Path(finished["home"]) / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("eft-default")
    (run,) = client.search_runs([experiment.experiment_id], f"tags.`eft.job_id` = '{job['id']}'")
    history = client.get_metric_history(run.info.run_id, "loss")
    assert len(history) == job["total_steps"] and run.info.status == "FINISHED"
