"""The scheduling simulator (`bench/simulation.py`) drives the service's policy code over
traces: exact on a case worked by hand, deterministic for a seed, honest about lost work."""

from __future__ import annotations

import pytest

from bench.simulation import Cluster, SimJob, generate_trace, scaled, simulate

NO_SPOT = Cluster(on_demand_slots=8, spot_nodes=0, restart_s=60.0)


def test_one_job_on_an_empty_cluster_takes_its_start_and_its_work_at_full_size() -> None:
    job = SimJob(id="j", tenant="a", arrival=10.0, work_s=8000.0, min_workers=1, max_workers=4, sigma=0.1)
    result = simulate([job], NO_SPOT, policy="elastic")
    speedup = 4 / (1 + 0.1 * 3)
    assert result.completion["j"] == pytest.approx(10.0 + 60.0 + 8000.0 / speedup)
    assert result.restarts == 0 and result.lost_work_s == 0.0


def test_a_later_job_shrinks_the_first_and_both_finish_with_all_their_work() -> None:
    first = SimJob(id="a", tenant="a", arrival=0.0, work_s=40000.0, min_workers=1, max_workers=8, sigma=0.0)
    second = SimJob(id="b", tenant="b", arrival=1000.0, work_s=4000.0, min_workers=1, max_workers=8, sigma=0.0)
    result = simulate([first, second], NO_SPOT, policy="elastic")
    # b arrives: a shrinks to its tenant's half (a restart), b runs on the other half; when b is
    # done a grows back (a second restart). Work is conserved: a's 40000 worker-seconds are
    # done at 8, then 4 during b, then 8 again, with a minute lost to each restart.
    b_done = 1000.0 + 60.0 + 4000.0 / 4
    assert result.completion["b"] == pytest.approx(b_done)
    done_by_b = 8 * (1000.0 - 60.0) + 4 * (b_done - 1000.0 - 60.0)
    assert result.completion["a"] == pytest.approx(b_done + 60.0 + (40000.0 - done_by_b) / 8)
    assert result.restarts == 2


def test_the_same_seed_gives_the_same_trace_and_results() -> None:
    trace = generate_trace(150, seed=7)
    assert trace == generate_trace(150, seed=7)
    assert trace != generate_trace(150, seed=8)
    assert simulate(trace, policy="elastic", seed=3) == simulate(trace, policy="elastic", seed=3)


def test_a_notice_long_enough_for_a_checkpoint_loses_no_work_and_a_short_one_does() -> None:
    trace = generate_trace(200, seed=1)
    stormy = dict(spot_preemptions_per_node_hour=2.0, spot_return_s=300.0)
    warned = simulate(trace, Cluster(notice_s=30.0, checkpoint_s=10.0, **stormy), policy="elastic")
    assert warned.lost_work_s == 0.0 and warned.jobs == 200
    surprised = simulate(trace, Cluster(notice_s=0.0, checkpoint_s=10.0, **stormy), policy="elastic")
    assert surprised.lost_work_s > 0.0 and surprised.jobs == 200


def test_elastic_beats_fifo_on_completion_time_and_utilisation_under_load() -> None:
    trace = generate_trace(400, seed=0, load=1.0)
    fifo = simulate(trace, policy="fifo")
    elastic = simulate(trace, policy="elastic")
    assert fifo.jobs == elastic.jobs == 400
    assert elastic.mean_jct_s < 0.8 * fifo.mean_jct_s
    assert elastic.utilisation > fifo.utilisation
    assert elastic.fairness >= fifo.fairness


def test_rigid_jobs_under_the_elastic_policy_run_at_their_one_size() -> None:
    rigid = scaled(generate_trace(100, seed=2), min_workers=lambda j: j.request, max_workers=lambda j: j.request)
    assert all(j.min_workers == j.max_workers == j.request for j in rigid)
    assert simulate(rigid, policy="elastic").jobs == 100
