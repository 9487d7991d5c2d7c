"""Journey: jobs that survive: faults injected into real Ray Train jobs run through the service (a
killed worker and a lost driver, injected while their jobs train beside the reference; a job that
diverges; an elastic job on spot nodes that grows, shrinks for another job and is drained). The
object store and the whole cluster's loss have their modules: test_recovery_object_storage.py,
test_recovery_whole_cluster.py.

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
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tests.helpers.jobs import (SPOT, adapter_of, assert_same_adapter, at, checkpointed, event_check, events_of,
                                fetch, lora_body, losses_of, post, step_at_least, trained_steps, until,
                                worker_pids)
from tests.helpers.service_api import client, wait_for

RAY = str(Path(sys.executable).with_name("ray"))
STEPS = 100


@pytest.fixture(scope="module")
def faults(service):
    """The jobs the fault tests break and the uninterrupted run they are compared with (2
    workers each), posted at once so that they train side by side, and a job that diverges (1).
    Each fault is injected as soon as its job has a checkpoint Ray Train registered at step 40
    or later (while the others run on): a worker of one job is killed, the driver of the other.
    Returns the jobs and, per fault, the latest checkpoint when it was injected."""
    url = service["url"]
    # A rate this high overflows the loss within a few steps: a NaN loss is the user's to fix.
    # One worker: a NaN is found on each rank's own loss (the 2-worker path is the other jobs').
    diverges = lora_body("diverges", 200, workers=1, method={"alpha": 4096.0},
                         hyperparameters={"learning_rate": 1.0, "max_grad_norm": None})
    jobs = {"reference": post(url, lora_body("reference", STEPS)),
            "kill": post(url, lora_body("kill-a-worker", STEPS)),
            "driver": post(url, lora_body("lose-the-driver", STEPS)),
            "diverges": post(url, diverges)}
    latest: dict[str, int] = {}

    def kill_a_worker(job_id: str) -> None:
        pids = worker_pids(service["dashboard_url"], fetch(url, job_id))  # the others' train beside them
        assert len(pids) == 2, pids
        os.kill(pids[1], signal.SIGKILL)

    def lose_the_driver(job_id: str) -> None:
        driver = subprocess.run(["pgrep", "-f", f"eft.service.runs.entrypoint --job-id {job_id} --attempt 1"],
                                capture_output=True, text=True).stdout.split()
        assert driver, "no driver process found"  # the driver, and the shell Ray Jobs started it with
        for pid in driver:
            os.kill(int(pid), signal.SIGKILL)

    faults_left = {"kill": kill_a_worker, "driver": lose_the_driver}

    def inject_when_checkpointed() -> bool:
        # Both jobs are watched at once: a fault waiting for the other's would find its job
        # finished on a fast machine.
        for name in list(faults_left):
            step = checkpointed(url, jobs[name]["id"], 40)
            if step:
                latest[name] = step
                faults_left.pop(name)(jobs[name]["id"])
        return not faults_left

    until("a checkpoint Ray Train has registered, in each job to break", inject_when_checkpointed)
    return {**jobs, "latest": latest}


@pytest.fixture(scope="module")
def reference(service, faults):
    """The uninterrupted run every fault test is compared with, once it succeeded."""
    return wait_for(faults["reference"]["id"], service["url"], {"succeeded"})


def test_killed_worker_restarts_from_the_latest_checkpoint(service, faults, reference):
    url, job, latest = service["url"], faults["kill"], faults["latest"]["kill"]
    done = wait_for(job["id"], url, {"succeeded"})

    assert done["restarts"] == 1 and done["attempt"] == 1 and done["preemptions"] == 0
    events = events_of(url, job["id"])
    restarted = [e for e in events if e["type"] == "restarted"]
    resumed = [e for e in events if e["type"] == "resumed"]
    assert len(restarted) == 1 and len(resumed) == 1, [e["type"] for e in events]
    resumed_at = resumed[0]["data"]["step"]
    assert resumed_at % 20 == 0 and resumed_at >= latest  # the latest checkpoint at the kill
    assert resumed[0]["data"]["lost_steps"] == done["lost_steps"] >= 1
    assert resumed[0]["data"]["world_size"] == 2
    # Every step trained, none skipped; the lost ones trained twice, with the same result.
    assert sorted(set(trained_steps(url, job["id"]))) == list(range(1, STEPS + 1))
    assert_same_adapter(done, reference, atol=1e-6)


def test_a_job_whose_driver_vanished_is_dispatched_again_and_resumes(service, faults, reference):
    """The Ray Job's driver dies (as when the head node is lost): the service queues the job
    again and the next attempt resumes from the checkpoint the first one left."""
    url, job, latest = service["url"], faults["driver"], faults["latest"]["driver"]
    done = wait_for(job["id"], url, {"succeeded"})

    assert done["attempt"] == 2 and done["restarts"] == 1
    events = events_of(url, job["id"])
    assert [e["data"].get("reason") for e in events if e["type"] == "restarted"] == ["driver_lost"]
    assert [e["data"]["submission_id"] for e in events if e["type"] == "submitted"] == [
        f"{job['id']}-attempt-1", f"{job['id']}-attempt-2"]
    resumed = [e for e in events if e["type"] == "resumed"]
    assert len(resumed) == 1 and resumed[0]["attempt"] == 2 and resumed[0]["data"]["step"] >= latest
    assert_same_adapter(done, reference, atol=1e-6)


def test_a_user_error_fails_at_once_without_a_restart(service, faults):
    url, job = service["url"], faults["diverges"]
    done = wait_for(job["id"], url, {"failed"})
    assert done["error"]["code"] == "user_error.nan_loss", done["error"]
    assert done["error"]["param"] == "hyperparameters.learning_rate"
    assert done["restarts"] == 0 and done["attempt"] == 1
    types = [e["type"] for e in events_of(url, job["id"])]
    assert "restarted" not in types and types.count("training_started") == 1, types


# --- elastic and spot ----------------------------------------------------------------------


# Long enough that the job is still running after each phase, with room to spare on a loaded
# machine: in two runs here (the reference training beside it until the growth) it grew at step
# 215 / 308, shrank for the urgent job at 245 / 340, trained on one worker while that job started
# and ran, grew back at 648 / 787 and was drained a few steps later, so 1150 leaves some 350
# steps after the last phase: a machine whose process starts are slower than its steps would
# otherwise see the job end before the drain.
ELASTIC_STEPS = 1150


def test_elastic_job_grows_makes_room_for_a_higher_priority_job_and_loses_nothing(service, spot_nodes):
    """min 1, max 3 workers on spot slots: starts on one node and grows to two when a second
    node joins; a high-priority job arriving on the full cluster makes it shrink to one worker,
    runs, and the elastic job grows back; a job whose minimum cannot be placed waits with a
    reason and an estimated start; the second node is drained (a preemption notice) and the job
    checkpoints before it goes and shrinks. Every resize resumes from a checkpoint taken at once
    (zero lost steps, every step trained once), and until it first grew the job trained exactly as
    a 1-worker reference run of the same request (bitwise equal losses).

    The reference is cancelled once it has passed that step: it would otherwise train all its
    steps on one of the two cores beside the scenario, and that a run resumed at another world
    size ends with the uninterrupted run's weights (within fp32 round-off) is held per strategy
    by tests/training/test_strategies.py, on the same driver."""
    url = service["url"]
    spot = {"resources": {SPOT: 1}}
    first = spot_nodes.start()
    # A gentler rate than the other tests': across world sizes the gradient is summed in another
    # order, and an unstable run would amplify that round-off far more than a stable one.
    gentle = {"learning_rate": 3e-4}
    job = post(url, lora_body("elastic", ELASTIC_STEPS, workers=(1, 3), scaling=spot,
                           checkpoint={"every_steps": 50}, hyperparameters=gentle))
    reference = post(url, lora_body("elastic-reference", ELASTIC_STEPS, workers=1, hyperparameters=gentle))
    jid = job["id"]
    until("training on one worker", lambda: step_at_least(url, jid, 1))

    # (3) A node joins (it takes a while to start: the job trains on one worker meanwhile): the
    # scheduler gives the job the new slot and it grows onto it.
    second = spot_nodes.start()
    grown = until("the job to grow", event_check(url, jid, "resumed", lambda e: e["data"]["world_size"] == 2))
    before = [m for m in fetch(url, jid, "/metrics") if "loss" in m["values"] and m["step"] <= grown["data"]["step"]]
    assert before and all(m["values"]["world_size"] == 1 for m in before)  # it started on one worker
    until("steps on two workers", lambda: step_at_least(url, jid, grown["data"]["step"] + 5))
    # The reference has done its part once past the growth (the steps before it are compared
    # below): cancelled if it still runs (on one worker from the start, it may have finished).
    ref = until("the reference past the growth", lambda: (
        (r := fetch(url, reference["id"]))["status"] in ("succeeded", "failed", "cancelled")
        or r["step"] >= grown["data"]["step"]) and r)
    assert ref["status"] in ("running", "succeeded"), ref
    if ref["status"] == "running":
        client(url).jobs.cancel(reference["id"])

    # (2) A high-priority job on the full cluster: the elastic job shrinks to its minimum for it.
    urgent = post(url, lora_body("urgent", 10, workers=1, scaling=spot, priority="high"))
    # (4) A job whose minimum (2 spot workers) cannot be placed while both run: it waits, saying why.
    wide = post(url, lora_body("wide", 40, workers=2, scaling=spot))
    made_room = until("the shrink for the urgent job", event_check(
        url, jid, "resumed", lambda e: e["data"]["world_size"] == 1 and e["id"] > grown["id"]))
    queue = until("the wide job's queue line with an estimated start", lambda: (
        (q := fetch(url, wide["id"]).get("queue")) and q["estimated_start"] and "does not fit" in q["reason"] and q))
    assert "2 worker(s)" in queue["reason"] and "slot(s)" in queue["reason"], queue
    client(url).jobs.cancel(wide["id"])
    urgent_done = wait_for(urgent["id"], url, {"succeeded"}, timeout_s=300)
    regrown = until("the job to grow back", event_check(
        url, jid, "resumed", lambda e: e["data"]["world_size"] == 2 and e["id"] > made_room["id"]))
    until("steps on two workers again", lambda: step_at_least(url, jid, regrown["data"]["step"] + 5))

    spot_nodes.drain(second)
    until("the preemption notice", event_check(url, jid, "preempted"))
    shrunk = until("the job to resume on one worker",
                    event_check(url, jid, "resumed", lambda e: e["data"]["world_size"] == 1
                           and e["id"] > regrown["id"]))
    done = wait_for(jid, url, {"succeeded"}, timeout_s=600)
    assert wait_for(reference["id"], url, {"cancelled", "succeeded"})["step"] >= grown["data"]["step"]

    assert shrunk["data"]["checkpoint_reason"] == "preemption"
    assert shrunk["data"]["lost_steps"] == 0  # the drain cost no work
    # The job did not idle through the notice: it restarted without the draining node before
    # the node's deadline, as a preemption (no failure counted).
    preempted = next(e for e in events_of(url, jid) if e["type"] == "preempted")
    restarted = next(e for e in events_of(url, jid) if e["type"] == "restarted" and e["id"] > preempted["id"])
    deadline = datetime.fromtimestamp(preempted["data"]["deadline_ms"] / 1000, tz=timezone.utc)
    assert restarted["data"]["reason"] == "preemption" and at(restarted) < deadline, (restarted, deadline)
    print(f"restarted {(at(restarted) - at(preempted)).total_seconds():.1f} s after the notice, "
          f"{(deadline - at(restarted)).total_seconds():.1f} s before the node's deadline")
    # Growing, shrinking for another job and growing back cost no work either: the workers
    # checkpointed when the controller decided to resize, and the new group resumed from it.
    for resize in (grown, made_room, regrown):
        assert resize["data"]["checkpoint_reason"] == "resize" and resize["data"]["lost_steps"] == 0, resize
    events = events_of(url, jid)
    resized = [e for e in events if e["type"] == "resized"]
    assert [(e["data"]["from_workers"], e["data"]["to_workers"]) for e in resized] == [(1, 2), (2, 1), (1, 2), (2, 1)]
    # The shrink names the job that needed the room, as does the scheduler's decision before it.
    assert resized[1]["data"]["because_of"] == urgent["id"] and urgent["id"] in resized[1]["message"], resized[1]
    scheduled = [e for e in events if e["type"] == "scheduled"]
    assert any(e["data"]["workers"] == 1 and e["data"]["because_of"] == urgent["id"] for e in scheduled), scheduled
    # The urgent job ran while the elastic one held its minimum, undisturbed.
    assert urgent_done["restarts"] == 0 and urgent_done["resizes"] == 0
    assert fetch(url, wide["id"])["status"] == "cancelled"
    saved = [e for e in events if e["type"] == "checkpoint_saved"]
    preemption_saves = [e for e in saved if e["data"]["reason"] == "preemption"]
    assert len(preemption_saves) == 1 and preemption_saves[0]["data"]["world_size"] == 2
    assert preemption_saves[0]["data"]["step"] == shrunk["data"]["step"]
    assert done["preemptions"] == 1 and done["resizes"] == 4 and done["restarts"] == 0
    assert done["num_workers"] == 1 and first.poll() is None
    # Every step trained exactly once, across all four resizes.
    assert sorted(trained_steps(url, jid)) == list(range(1, ELASTIC_STEPS + 1))
    resize_saves = [e for e in saved if e["data"]["reason"] == "resize"]
    assert [(e["data"]["step"], e["data"]["world_size"]) for e in resize_saves] == [
        (grown["data"]["step"], 1), (made_room["data"]["step"], 2), (regrown["data"]["step"], 1)]
    # A resize's cost is on its event: from the decision (before the checkpoint was saved) to
    # the resized group holding the checkpoint.
    for resize, save in zip((grown, made_room, regrown), resize_saves):
        pause_s = resize["data"]["resize_pause_s"]
        assert pause_s >= (at(resize) - at(save)).total_seconds() - 1.0 > 0, resize
        print(f"resize to {resize['data']['world_size']} at step {resize['data']['step']}: {pause_s:.1f} s pause")
    # Until the job first grew it ran at the reference's world size: the same losses, bit for bit.
    ours, theirs = losses_of(url, jid), losses_of(url, reference["id"])
    before_growth = range(1, grown["data"]["step"] + 1)
    assert [ours[s] for s in before_growth] == [theirs[s] for s in before_growth]
    # After it the run went on learning across the four resizes: no NaN, and its last 100 steps'
    # mean loss below its first 100's.
    losses = [ours[s] for s in sorted(ours)]
    assert all(loss == loss for loss in losses) and sum(losses[-100:]) < sum(losses[:100]), (losses[:5], losses[-5:])
    assert adapter_of(done)
    checkpoints = fetch(url, jid, "/checkpoints")
    assert all(c["size_bytes"] > 0 for c in checkpoints)
    assert {c["reason"] for c in checkpoints} >= {"interval", "resize", "preemption", "final"}
