"""Jobs that survive: faults injected into real Ray Train jobs run through the service.

Each recovered job is compared with an uninterrupted reference run of the same request: the
sample order is a function of (seed, step), dropout is off and the learning rate constant, so
a recovered run must end with the same adapter (up to fp32 round-off across world sizes).
Only processes these tests started are ended, by pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from safetensors.torch import load_file

from tests.e2e.conftest import as_json, client, wait_for

pytestmark = pytest.mark.e2e
RAY = str(Path(sys.executable).with_name("ray"))
SPOT = "eft_test_spot"


def _body(name: str, steps: int, workers: int | tuple[int, int] = 2, **extra: Any) -> dict:
    low, high = (workers, workers) if isinstance(workers, int) else workers
    body = {
        "name": name,
        "model": "tiny-llama",
        "training_file": "demo/chat_train.jsonl",
        "method": {"type": "lora", "r": 8, "alpha": 16, "dropout": 0.0},
        "hyperparameters": {"max_steps": steps, "learning_rate": 2e-3, "lr_scheduler": "constant",
                            "global_batch_size": 8, "micro_batch_size": 2, "max_seq_len": 96,
                            "seed": 11},
        "scaling": {"min_workers": low, "max_workers": high},
        "strategy": "ddp",
        "checkpoint": {"every_steps": 20, "keep": 2},
    }
    for key, value in extra.items():
        body[key] = {**body.get(key, {}), **value} if isinstance(value, dict) else value
    return body


def _post(url: str, body: dict) -> dict:
    return as_json(client(url).jobs.create(body))


def _get(url: str, job_id: str, what: str = "") -> Any:
    """The job, or with `what` one of its lists (`/metrics`, `/checkpoints`), as JSON."""
    jobs = client(url).jobs
    if not what:
        return as_json(jobs.retrieve(job_id))
    return as_json({"/metrics": jobs.metrics, "/checkpoints": jobs.checkpoints}[what](job_id))["data"]


def _events(url: str, job_id: str) -> list[dict]:
    return as_json(client(url).jobs.list_events(job_id, limit=1000))["data"]


def _until(what: str, check: Callable[[], Any], timeout_s: float = 240) -> Any:
    """Poll `check` until it returns something truthy; fail naming `what` otherwise."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.3)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}")


def _adapter(job: dict) -> dict[str, torch.Tensor]:
    return load_file(str(Path(job["artifact_path"]) / "adapter_model.safetensors"))


def _assert_same_adapter(job: dict, reference: dict, atol: float) -> None:
    ours, theirs = _adapter(job), _adapter(reference)
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        torch.testing.assert_close(ours[name], tensor, rtol=0, atol=atol, msg=name)


def _losses(url: str, job_id: str) -> dict[int, float]:
    return {m["step"]: m["values"]["loss"] for m in _get(url, job_id, "/metrics") if "loss" in m["values"]}


def _at(event: dict) -> datetime:
    return datetime.fromisoformat(event["created_at"].replace("Z", "+00:00"))


def _trained_steps(url: str, job_id: str) -> list[int]:
    return [m["step"] for m in _get(url, job_id, "/metrics") if "loss" in m["values"]]


def _step_at_least(url: str, job_id: str, step: int) -> bool:
    job = _get(url, job_id)
    if job["status"] in ("succeeded", "failed", "cancelled"):
        pytest.fail(f"job {job_id} ended ({job['status']}) before step {step}: {job.get('error')}")
    return job["step"] >= step


def _checkpointed(url: str, job_id: str, step: int) -> int:
    """The latest checkpoint's step once one at `step` or later is registered, else 0."""
    _step_at_least(url, job_id, 0)  # fails early if the job already ended
    steps = [c["step"] for c in _get(url, job_id, "/checkpoints")]
    return max(steps) if steps and max(steps) >= step else 0


def _worker_pids(dashboard_url: str) -> list[int]:
    from ray.util.state import list_actors

    actors = list_actors(address=dashboard_url,
                         filters=[("class_name", "=", "RayTrainWorker"), ("state", "=", "ALIVE")])
    return [a.pid for a in actors if a.pid]


STEPS = 160


@pytest.fixture(scope="module")
def reference(service):
    """The uninterrupted run every fault test is compared with (2 workers)."""
    job = _post(service["url"], _body("reference", STEPS))
    return wait_for(job["id"], service["url"], {"succeeded"})


def test_killed_worker_restarts_from_the_latest_checkpoint(service, reference):
    url = service["url"]
    job = _post(url, _body("kill-a-worker", STEPS))
    latest = _until("a checkpoint Ray Train has registered", lambda: _checkpointed(url, job["id"], 40))
    pids = _worker_pids(service["dashboard_url"])
    assert len(pids) == 2, pids
    os.kill(pids[1], signal.SIGKILL)
    done = wait_for(job["id"], url, {"succeeded"})

    assert done["restarts"] == 1 and done["attempt"] == 1 and done["preemptions"] == 0
    events = _events(url, job["id"])
    restarted = [e for e in events if e["type"] == "restarted"]
    resumed = [e for e in events if e["type"] == "resumed"]
    assert len(restarted) == 1 and len(resumed) == 1, [e["type"] for e in events]
    resumed_at = resumed[0]["data"]["step"]
    assert resumed_at % 20 == 0 and resumed_at >= latest  # the latest checkpoint at the kill
    assert resumed[0]["data"]["lost_steps"] == done["lost_steps"] >= 1
    assert resumed[0]["data"]["world_size"] == 2
    # Every step trained, none skipped; the lost ones trained twice, with the same result.
    assert sorted(set(_trained_steps(url, job["id"]))) == list(range(1, STEPS + 1))
    _assert_same_adapter(done, reference, atol=1e-6)


def test_a_job_whose_driver_vanished_is_dispatched_again_and_resumes(service, reference):
    """The Ray Job's driver dies (as when the head node is lost): the service queues the job
    again and the next attempt resumes from the checkpoint the first one left."""
    url = service["url"]
    job = _post(url, _body("lose-the-driver", STEPS))
    latest = _until("a checkpoint Ray Train has registered", lambda: _checkpointed(url, job["id"], 40))
    driver = subprocess.run(["pgrep", "-f", f"eft.service.entrypoint --job-id {job['id']} --attempt 1"],
                            capture_output=True, text=True).stdout.split()
    assert driver, "no driver process found"  # the driver, and the shell Ray Jobs started it with
    for pid in driver:
        os.kill(int(pid), signal.SIGKILL)
    done = wait_for(job["id"], url, {"succeeded"})

    assert done["attempt"] == 2 and done["restarts"] == 1
    events = _events(url, job["id"])
    assert [e["data"].get("reason") for e in events if e["type"] == "restarted"] == ["driver_lost"]
    assert [e["data"]["submission_id"] for e in events if e["type"] == "submitted"] == [
        f"{job['id']}-attempt-1", f"{job['id']}-attempt-2"]
    resumed = [e for e in events if e["type"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["attempt"] == 2 and resumed[0]["data"]["step"] >= latest
    _assert_same_adapter(done, reference, atol=1e-6)


def test_a_user_error_fails_at_once_without_a_restart(service):
    url = service["url"]
    # A rate this high overflows the loss within a few steps: a NaN loss is the user's to fix.
    body = _body("diverges", 200, method={"alpha": 4096.0},
                 hyperparameters={"learning_rate": 1.0, "max_grad_norm": None})
    job = _post(url, body)
    done = wait_for(job["id"], url, {"failed"})
    assert done["error"]["code"] == "user_error.nan_loss", done["error"]
    assert done["error"]["param"] == "hyperparameters.learning_rate"
    assert done["restarts"] == 0 and done["attempt"] == 1
    types = [e["type"] for e in _events(url, job["id"])]
    assert "restarted" not in types and types.count("training_started") == 1, types


# --- elastic and spot ----------------------------------------------------------------------


class SpotNodes:
    """Extra Ray nodes on this machine, each offering one `eft_test_spot` slot, as spot nodes
    do. SIGTERM to a node's `ray start --block` drains it first (a preemption notice with a
    deadline), as a spot reclaim does."""

    def __init__(self, gcs_address: str, log_dir: Path):
        self.gcs_address, self.log_dir = gcs_address, log_dir
        self.procs: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        import ray

        before = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        # A 15 s notice (GCP and Azure give 30 s, AWS 2 min): the service's preemption watch
        # polls every 0.5 s here (EFT_PREEMPTION_POLL_INTERVAL_S), and the preemption checkpoint
        # is saved and registered within a second or two of the notice; an elastic job then
        # goes on without the node at once, a fixed-size one waits out the notice.
        env = {**os.environ, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "15"}
        log = open(self.log_dir / f"node-{len(self.procs)}.log", "w")
        proc = subprocess.Popen(
            [RAY, "start", f"--address={self.gcs_address}", "--num-cpus=1",
             f'--resources={{"{SPOT}": 1}}', "--block"],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self.procs.append(proc)
        _until("the new node to join", lambda: any(
            n["Alive"] and n["NodeID"] not in before and SPOT in n["Resources"] for n in ray.nodes()))
        return proc

    def drain(self, proc: subprocess.Popen) -> None:
        proc.send_signal(signal.SIGTERM)

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def spot_nodes(service, tmp_path):
    import ray

    nodes = SpotNodes(ray.get_runtime_context().gcs_address, tmp_path)
    yield nodes
    nodes.stop_all()


def _event(url: str, job_id: str, type_: str, where: Callable[[dict], bool] = lambda e: True):
    def check() -> dict | None:
        job = _get(url, job_id)
        if job["status"] in ("succeeded", "failed", "cancelled"):
            pytest.fail(f"job ended ({job['status']}) at step {job['step']} before a {type_} event: {job.get('error')}")
        return next((e for e in _events(url, job_id) if e["type"] == type_ and where(e)), None)

    return check


# Long enough that the job is still running after each phase, with room to spare on a loaded
# machine: in two runs alone here it grew at step 308 / 383, shrank for the urgent job at 340 /
# 413, trained on one worker while that job started and ran, grew back at 787 / 762 and was
# drained a few steps later, so 1150 leaves some 300 steps after the last phase.
ELASTIC_STEPS = 1150


def test_elastic_job_grows_makes_room_for_a_higher_priority_job_and_loses_nothing(service, spot_nodes):
    """min 1, max 3 workers on spot slots: starts on one node and grows to two when a second
    node joins; a high-priority job arriving on the full cluster makes it shrink to one worker,
    runs, and the elastic job grows back; a job whose minimum cannot be placed waits with a
    reason and an estimated start; the second node is drained (a preemption notice) and the job
    checkpoints before it goes and shrinks. Every resize resumes from a checkpoint taken at once
    (zero lost steps, every step trained once), and the adapter equals a 1-worker reference run's."""
    url = service["url"]
    spot = {"resources": {SPOT: 1}}
    first = spot_nodes.start()
    # A gentler rate than the other tests': across world sizes the gradient is summed in another
    # order, and an unstable run would amplify that round-off far more than a stable one.
    gentle = {"learning_rate": 3e-4}
    job = _post(url, _body("elastic", ELASTIC_STEPS, workers=(1, 3), scaling=spot,
                           checkpoint={"every_steps": 50}, hyperparameters=gentle))
    reference = _post(url, _body("elastic-reference", ELASTIC_STEPS, workers=1, hyperparameters=gentle))
    jid = job["id"]
    _until("training on one worker", lambda: _step_at_least(url, jid, 1))

    # (3) A node joins (it takes a while to start: the job trains on one worker meanwhile): the
    # scheduler gives the job the new slot and it grows onto it.
    second = spot_nodes.start()
    grown = _until("the job to grow", _event(url, jid, "resumed", lambda e: e["data"]["world_size"] == 2))
    before = [m for m in _get(url, jid, "/metrics") if "loss" in m["values"] and m["step"] <= grown["data"]["step"]]
    assert before and all(m["values"]["world_size"] == 1 for m in before)  # it started on one worker
    _until("steps on two workers", lambda: _step_at_least(url, jid, grown["data"]["step"] + 5))

    # (2) A high-priority job on the full cluster: the elastic job shrinks to its minimum for it.
    urgent = _post(url, _body("urgent", 50, workers=1, scaling=spot, priority="high"))
    # (4) A job whose minimum (2 spot workers) cannot be placed while both run: it waits, saying why.
    wide = _post(url, _body("wide", 40, workers=2, scaling=spot))
    made_room = _until("the shrink for the urgent job", _event(
        url, jid, "resumed", lambda e: e["data"]["world_size"] == 1 and e["id"] > grown["id"]))
    queue = _until("the wide job's queue line with an estimated start", lambda: (
        (q := _get(url, wide["id"]).get("queue")) and q["estimated_start"] and "does not fit" in q["reason"] and q))
    assert "2 worker(s)" in queue["reason"] and "slot(s)" in queue["reason"], queue
    client(url).jobs.cancel(wide["id"])
    urgent_done = wait_for(urgent["id"], url, {"succeeded"}, timeout_s=300)
    regrown = _until("the job to grow back", _event(
        url, jid, "resumed", lambda e: e["data"]["world_size"] == 2 and e["id"] > made_room["id"]))
    _until("steps on two workers again", lambda: _step_at_least(url, jid, regrown["data"]["step"] + 5))

    spot_nodes.drain(second)
    _until("the preemption notice", _event(url, jid, "preempted"))
    shrunk = _until("the job to resume on one worker",
                    _event(url, jid, "resumed", lambda e: e["data"]["world_size"] == 1
                           and e["id"] > regrown["id"]))
    done = wait_for(jid, url, {"succeeded"}, timeout_s=600)
    reference = wait_for(reference["id"], url, {"succeeded"}, timeout_s=600)

    assert shrunk["data"]["checkpoint_reason"] == "preemption"
    assert shrunk["data"]["lost_steps"] == 0  # the drain cost no work
    # The job did not idle through the notice: it restarted without the draining node before
    # the node's deadline, as a preemption (no failure counted).
    preempted = next(e for e in _events(url, jid) if e["type"] == "preempted")
    restarted = next(e for e in _events(url, jid) if e["type"] == "restarted" and e["id"] > preempted["id"])
    deadline = datetime.fromtimestamp(preempted["data"]["deadline_ms"] / 1000, tz=timezone.utc)
    assert restarted["data"]["reason"] == "preemption" and _at(restarted) < deadline, (restarted, deadline)
    print(f"restarted {(_at(restarted) - _at(preempted)).total_seconds():.1f} s after the notice, "
          f"{(deadline - _at(restarted)).total_seconds():.1f} s before the node's deadline")
    # Growing, shrinking for another job and growing back cost no work either: the workers
    # checkpointed when the controller decided to resize, and the new group resumed from it.
    for resize in (grown, made_room, regrown):
        assert resize["data"]["checkpoint_reason"] == "resize" and resize["data"]["lost_steps"] == 0, resize
    events = _events(url, jid)
    resized = [e for e in events if e["type"] == "resized"]
    assert [(e["data"]["from_workers"], e["data"]["to_workers"]) for e in resized] == [(1, 2), (2, 1), (1, 2), (2, 1)]
    # The shrink names the job that needed the room, as does the scheduler's decision before it.
    assert resized[1]["data"]["because_of"] == urgent["id"] and urgent["id"] in resized[1]["message"], resized[1]
    scheduled = [e for e in events if e["type"] == "scheduled"]
    assert any(e["data"]["workers"] == 1 and e["data"]["because_of"] == urgent["id"] for e in scheduled), scheduled
    # The urgent job ran while the elastic one held its minimum, undisturbed.
    assert urgent_done["restarts"] == 0 and urgent_done["resizes"] == 0
    assert _get(url, wide["id"])["status"] == "cancelled"
    saved = [e for e in events if e["type"] == "checkpoint_saved"]
    preemption_saves = [e for e in saved if e["data"]["reason"] == "preemption"]
    assert len(preemption_saves) == 1 and preemption_saves[0]["data"]["world_size"] == 2
    assert preemption_saves[0]["data"]["step"] == shrunk["data"]["step"]
    assert done["preemptions"] == 1 and done["resizes"] == 4 and done["restarts"] == 0
    assert done["num_workers"] == 1 and first.poll() is None
    # Every step trained exactly once, across all four resizes.
    assert sorted(_trained_steps(url, jid)) == list(range(1, ELASTIC_STEPS + 1))
    resize_saves = [e for e in saved if e["data"]["reason"] == "resize"]
    assert [(e["data"]["step"], e["data"]["world_size"]) for e in resize_saves] == [
        (grown["data"]["step"], 1), (made_room["data"]["step"], 2), (regrown["data"]["step"], 1)]
    # A resize's cost is on its event: from the decision (before the checkpoint was saved) to
    # the resized group holding the checkpoint.
    for resize, save in zip((grown, made_room, regrown), resize_saves):
        pause_s = resize["data"]["resize_pause_s"]
        assert pause_s >= (_at(resize) - _at(save)).total_seconds() - 1.0 > 0, resize
        print(f"resize to {resize['data']['world_size']} at step {resize['data']['step']}: {pause_s:.1f} s pause")
    # Until the job first grew it ran at the reference's world size: the same losses, bit for bit.
    ours, theirs = _losses(url, jid), _losses(url, reference["id"])
    before_growth = range(1, grown["data"]["step"] + 1)
    assert [ours[s] for s in before_growth] == [theirs[s] for s in before_growth]
    # After it, 2 workers sum each gradient in another order than 1 does: fp32 round-off (1e-7
    # at first), which training then carries along and amplifies (1e-5 after some 600 steps
    # here); the run stays within 1% of the reference, its adapter too (rel L2).
    drift = max(abs(ours[s] - theirs[s]) / theirs[s] for s in theirs)
    a, b = _adapter(done), _adapter(reference)
    difference = sum(float(((a[k] - b[k]) ** 2).sum()) for k in b) ** 0.5
    relative = difference / sum(float((b[k] ** 2).sum()) for k in b) ** 0.5
    print(f"against the 1-worker reference: loss within {drift:.1e}, adapter rel L2 {relative:.1e}")
    assert drift < 1e-2 and relative < 1e-2
    checkpoints = _get(url, jid, "/checkpoints")
    assert all(c["size_bytes"] > 0 for c in checkpoints)
    assert {c["reason"] for c in checkpoints} >= {"interval", "resize", "preemption", "final"}


def test_two_tenants_with_equal_weights_each_get_half_the_slots(service, spot_nodes):
    """Two spot slots, two tenants of equal weight with two one-worker jobs each, all queued
    behind a job that holds both slots: once the slots free, each tenant gets one, although
    one tenant's jobs all came first; the others wait, saying why."""
    from eft import Client

    from tests.e2e.conftest import key_for

    url = service["url"]
    spot = {"resources": {SPOT: 1}}
    spot_nodes.start()
    spot_nodes.start()
    blocker = _post(url, _body("blocker", 2000, workers=2, scaling=spot))
    _until("the blocker on both slots", lambda: _step_at_least(url, blocker["id"], 1))
    tenants = {t: Client(base_url=url, api_key=key_for(service["home"], t), timeout=60) for t in ("team-a", "team-b")}
    # Team a's jobs arrive first: first come, first served would give it both slots.
    posted = [(t, as_json(tenants[t].jobs.create(_body(f"{t}-{i % 2}", 2000, workers=1, scaling=spot))))
              for i, t in enumerate(("team-a", "team-a", "team-b", "team-b"))]

    def job(tenant: str, job_id: str) -> dict:
        return as_json(tenants[tenant].jobs.retrieve(job_id))

    _until("the four queued with a reason", lambda: all(
        (j := job(t, p["id"]))["status"] == "queued" and j.get("queue") for t, p in posted))
    line = job("team-b", posted[2][1]["id"])["queue"]
    assert "does not fit now" in line["reason"] and "cpu+eft_test_spot" in line["reason"], line
    client(url).jobs.cancel(blocker["id"])
    running = _until("two of them running", lambda: (
        r if len(r := [(t, p["id"]) for t, p in posted if job(t, p["id"])["status"] == "running"]) >= 2 else None))
    assert sorted(t for t, _ in running) == ["team-a", "team-b"], running
    # The two that wait stay queued while the slots are taken, one of each tenant.
    waiting = [(t, p["id"]) for t, p in posted if (t, p["id"]) not in running]
    assert sorted(t for t, _ in waiting) == ["team-a", "team-b"]
    assert all(job(t, i)["status"] == "queued" for t, i in waiting)
    for tenant, posted_job in posted:
        tenants[tenant].jobs.cancel(posted_job["id"])
    _until("every job cancelled", lambda: all(job(t, p["id"])["status"] == "cancelled" for t, p in posted)
           and _get(url, blocker["id"])["status"] == "cancelled", timeout_s=120)


# --- the service itself --------------------------------------------------------------------


def test_service_restarts_while_one_job_runs_and_one_waits(service):
    url = service["url"]
    service["restart"](EFT_MAX_RUNNING_JOBS="1")
    try:
        running = _post(url, _body("runs-through-restarts", 300))
        waiting = _post(url, _body("waits-through-restarts", 40))
        _until("the first job to train", lambda: _step_at_least(url, running["id"], 5))
        assert _get(url, waiting["id"])["status"] == "queued"

        service["restart"](EFT_MAX_RUNNING_JOBS="1")
        assert _get(url, waiting["id"])["status"] == "queued"
        assert _get(url, running["id"])["status"] == "running"
        done = [wait_for(j["id"], url, {"succeeded"}) for j in (running, waiting)]
    finally:
        service["restart"]()

    for job in done:
        assert job["attempt"] == 1 and job["restarts"] == 0
        types = [e["type"] for e in _events(url, job["id"])]
        assert types.count("submitted") == 1 and types.count("training_started") == 1, types
        assert types[:4] == ["created", "queued", "dispatched", "submitted"]
        assert types[-1] == "succeeded"
        assert sorted(set(_trained_steps(url, job["id"]))) == list(range(1, job["total_steps"] + 1))
    # The waiting job only started once the running one had finished.
    assert done[1]["started_at"] >= done[0]["finished_at"]
