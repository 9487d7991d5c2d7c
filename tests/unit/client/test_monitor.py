"""Progress, ETA and the loss plot, as the terminal and the job object show them."""

import struct
from datetime import datetime, timedelta, timezone

from eft.types.jobs import Job, JobMetric, JobStatus
from eft import monitor
from eft._base import server_events
from eft.service.jobs.progress import progress_fields
from eft.service.store.store import JobRecord

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def _record(**kw) -> JobRecord:
    base = dict(id="ftjob-x", tenant="default", name="demo", status=JobStatus.running, request={}, config={},
                attempt=1, num_workers=1, submission_id=None, step=10, total_steps=40, error_code=None,
                error_message=None, error_param=None, artifact_path=None, result_metrics=None, restarts=0,
                preemptions=0, resizes=0, lost_steps=0, plan=None, schedule=None, estimate=None,
                worker_seconds=0.0, spot_worker_seconds=0.0, created_at=NOW,
                updated_at=NOW, started_at=NOW - timedelta(seconds=100), finished_at=None)
    return JobRecord(**{**base, **kw})


def test_progress_and_eta_from_the_last_step_time():
    fields = progress_fields(_record(), {"step_time_s": 2.0, "trained_tokens": 1234}, NOW)
    assert fields["progress"] == 0.25
    assert fields["estimated_finish"] == NOW + timedelta(seconds=60)
    assert fields["trained_tokens"] == 1234


def test_eta_before_any_report_uses_time_since_start():
    fields = progress_fields(_record(), None, NOW)
    assert fields["estimated_finish"] == NOW + timedelta(seconds=30 * 10.0)
    assert fields["trained_tokens"] is None


def test_no_eta_unless_running_and_full_progress_on_success():
    assert progress_fields(_record(status=JobStatus.queued, step=0), None, NOW)["estimated_finish"] is None
    done = progress_fields(_record(status=JobStatus.succeeded, step=40), {"trained_tokens": 9}, NOW)
    assert done["progress"] == 1.0 and done["estimated_finish"] is None and done["trained_tokens"] == 9
    assert progress_fields(_record(total_steps=None, step=0), None, NOW)["progress"] is None


def _job(**kw) -> Job:
    return Job.model_validate({
        "id": "ftjob-x", "status": "running", "model": "tiny-llama", "training_file": "t.jsonl",
        "method": {"type": "lora"}, "hyperparameters": {}, "scaling": {}, "strategy": "auto",
        "checkpoint": {}, "created_at": NOW.isoformat(), "step": 3, "total_steps": 8, **kw})


def test_progress_text_shows_step_loss_tokens_and_eta():
    job = _job(estimated_finish=(datetime.now(timezone.utc) + timedelta(seconds=65, milliseconds=500)).isoformat())
    metric = JobMetric(step=3, created_at=NOW, values={"loss": 2.5, "tokens_per_s": 1500.0})
    text = monitor.progress_text(job, metric)
    assert text == "step 3/8  loss 2.5000  1,500 tok/s  ETA 1m05s"
    assert monitor.progress_text(_job(), None) == "step 3/8"


def test_plot_writes_a_png_of_both_curves(tmp_path):
    points = [JobMetric(step=s, created_at=NOW, values={"loss": 3.0 / s}) for s in range(1, 6)]
    points.append(JobMetric(step=5, created_at=NOW, values={"loss": 0.6, "eval_loss": 0.7}))
    path = monitor.plot_losses(_job(), points, tmp_path / "plots" / "loss.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (800, 450)


def test_plot_refuses_a_job_without_losses(tmp_path):
    import pytest

    with pytest.raises(ValueError, match="no loss yet"):
        monitor.plot_losses(_job(), [], tmp_path / "x.png")


def test_server_events_keep_log_lines_ids_and_control_events_and_skip_keep_alives():
    stream = ["event: attempt", 'data: {"attempt": 1}', "", "id: 1:1", "data: step 1 loss 2.0", "",
              ": ping", "", "id: 1:2", "data: two", "data: lines", "", "event: end",
              'data: {"status": "succeeded"}']
    events = list(server_events(stream))
    assert [(e.event, e.id, e.data) for e in events] == [
        ("attempt", None, '{"attempt": 1}'), (None, "1:1", "step 1 loss 2.0"),
        (None, "1:2", "two\nlines"), ("end", None, '{"status": "succeeded"}')]
    assert events[-1].json() == {"status": "succeeded"}


def test_tensorboard_tracker_writes_scalars_and_they_join_the_published_adapter(tmp_path):
    from eft.training.trackers import TensorBoardTracker, with_tensorboard

    tracker = TensorBoardTracker(tmp_path / "artifacts", "ftjob-x", 2)
    tracker.log(1, {"loss": 2.0, "learning_rate": 1e-3})
    tracker.log(2, {"loss": 1.5, "eval_loss": 1.7})
    tracker.close()
    adapter = tmp_path / "checkpoint" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    (tmp_path / "scratch").mkdir()
    staged = with_tensorboard(tmp_path / "artifacts", "ftjob-x", adapter, tmp_path / "scratch")
    assert (staged / "adapter_config.json").read_text() == "{}"
    assert not (adapter / "tensorboard").exists()  # the checkpoint stays as it was
    (events,) = (staged / "tensorboard" / "attempt-2").glob("events.out.tfevents.*")
    data = events.read_bytes()
    assert b"train/loss" in data and b"train/learning_rate" in data and b"eval/loss" in data
    assert with_tensorboard(tmp_path / "artifacts", "ftjob-none", adapter, tmp_path / "scratch") == adapter


def test_mlflow_tracker_logs_a_run_per_attempt_to_a_file_store(tmp_path):
    from mlflow.tracking import MlflowClient

    from eft.service.runs.entrypoint import run_spec
    from eft.service.settings import Settings
    from eft.training.trackers import trackers_for

    uri = (tmp_path / "mlruns").as_uri()
    settings = Settings(home=tmp_path, mlflow_tracking_uri=uri)
    job = _record(request={"trackers": {"mlflow": True}}, attempt=2)
    (tracker,) = trackers_for(run_spec(job, settings), None)
    tracker.log(1, {"loss": 2.0})
    tracker.log(2, {"loss": 1.5, "eval_loss": 1.7})
    tracker.close()
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(tracker.run_id)
    assert run.info.run_name == "demo (ftjob-x)" and run.data.tags["eft.attempt"] == "2"
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "loss")] == [(1, 2.0), (2, 1.5)]
    assert run.info.status == "FINISHED"
    assert trackers_for(run_spec(_record(request={}), settings), None) == []
