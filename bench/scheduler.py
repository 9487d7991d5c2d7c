"""Scheduler benchmark: the cluster scheduling policy in a discrete-event simulation, against
FIFO and static fair share.

Run from the repository root:

    .venv/bin/python bench/scheduler.py                  # writes its section of BENCHMARKS.md
    .venv/bin/python bench/scheduler.py --jobs 300 --scale-jobs 0 --output /tmp/b.md

The simulator (`bench/simulation.py`) calls the service's own policy code
(`eft.service.scheduling.policy.plan`) at every arrival, completion, spot preemption and node return. The
traces come from `generate_trace(jobs, seed, load=...)`: Poisson arrivals at `load` times what
the cluster serves at the jobs' requested sizes, work log-normal (median one GPU-hour), requested
sizes 1-16 workers, 70% of jobs elastic (a quarter of the request up to twice it), scaling
losses 0-15% per worker, 10% high and 20% low priority, four tenants of equal weight sending
40/30/20/10% of the jobs. The cluster: 32 on-demand slots and 8 spot nodes of 8 slots, each
spot node preempted 0.1 times an hour with a 30 s notice (a checkpoint takes 10 s) and replaced
after ~10 minutes; every start, resize and restart costs 60 s without progress.

Every policy runs the same trace with the same preemptions (same seed). `fifo` runs each job at
its requested size in arrival order (dispatch by count, the head of the queue blocking);
`static` gives each tenant a fixed equal partition; `elastic` is the product's policy.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench.report import replace_section  # noqa: E402
from bench.speed import machine  # noqa: E402

SECTION = "## Scheduler: a simulated cluster"
POLICIES = ("fifo", "static", "elastic")


def row(label: str, result, fifo_jct: float, seconds: float) -> str:
    hours = 3600.0
    return (f"| {label} | {result.policy} | {result.mean_jct_s / hours:.2f} | {result.p50_jct_s / hours:.2f} | "
            f"{result.p99_jct_s / hours:.1f} | {result.mean_wait_s / hours:.2f} | {100 * result.utilisation:.0f}% | "
            f"{100 * result.goodput:.0f}% | {result.fairness:.2f} | {result.restarts} | "
            f"{result.lost_work_s / hours:.1f} | {result.mean_jct_s / fifo_jct:.2f} | {seconds:.1f} |")


def main(argv: list[str] | None = None) -> int:
    from bench.simulation import Cluster, generate_trace, scaled, simulate

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--loads", default="0.7,0.9,1.0,1.2")
    parser.add_argument("--scale-jobs", type=int, default=10000, help="one trace this long at load 0.9 (0: none)")
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)

    cluster = Cluster()
    lines = []
    ratios = {}

    def run(label: str, trace, policies, cluster=cluster) -> None:
        fifo_jct = None
        for policy in policies:
            started = time.perf_counter()
            result = simulate(trace, cluster, policy=policy, seed=args.seed)
            seconds = time.perf_counter() - started
            fifo_jct = fifo_jct or result.mean_jct_s
            lines.append(row(label, result, fifo_jct, seconds))
            print(lines[-1], flush=True)
            if policy == "elastic":
                ratios[label] = result.mean_jct_s / fifo_jct

    for load in (float(x) for x in args.loads.split(",")):
        run(f"{args.jobs} jobs, load {load:g}", generate_trace(args.jobs, seed=args.seed, cluster=cluster, load=load),
            POLICIES)
    short_notice = Cluster(notice_s=0.0)
    run(f"{args.jobs} jobs, load 0.9, no notice", generate_trace(args.jobs, seed=args.seed, cluster=short_notice, load=0.9),
        ("fifo", "elastic"), cluster=short_notice)
    # The same jobs from one tenant: no fair share to keep (Pollux's and Sia's setting), what the
    # tenants' fairness costs the mean.
    run(f"{args.jobs} jobs, load 0.9, one tenant",
        scaled(generate_trace(args.jobs, seed=args.seed, cluster=cluster, load=0.9), tenant="a"), ("fifo", "elastic"))
    if args.scale_jobs:
        run(f"{args.scale_jobs} jobs, load 0.9", generate_trace(args.scale_jobs, seed=args.seed, cluster=cluster, load=0.9),
            ("fifo", "elastic"))

    main_label = f"{args.jobs} jobs, load 0.9"
    section = "\n".join([
        SECTION, "",
        f"`bench/scheduler.py` on {datetime.now():%Y-%m-%d %H:%M} UTC. Machine: {machine()}.", "",
        "The scheduling policy the service's code implements (`eft.service.scheduling.policy`), driven by a discrete-event "
        "simulation (`bench/simulation.py`) over traces from `generate_trace(jobs, seed="
        f"{args.seed}, load=...)`: {cluster.on_demand_slots} on-demand slots and {cluster.spot_nodes} spot nodes of "
        f"{cluster.slots_per_spot_node} slots ({cluster.slots} in all), each spot node preempted "
        f"{cluster.spot_preemptions_per_node_hour:g}/hour with a {cluster.notice_s:g} s notice (a checkpoint takes "
        f"{cluster.checkpoint_s:g} s) and replaced after ~{cluster.spot_return_s / 60:.0f} min; a start, resize or "
        f"restart costs {cluster.restart_s:g} s without progress. Jobs: Poisson arrivals at `load` times what the "
        "cluster serves at the requested sizes, log-normal work (median one GPU-hour), requested sizes 1-16, 70% "
        "elastic (a quarter of the request to twice it), scaling loss 0-15% per worker, 10% high / 20% low "
        "priority, four equal-weight tenants sending 40/30/20/10% of the jobs. `fifo`: requested size, arrival "
        "order, the head blocks the queue (dispatch by count); `static`: a fixed equal partition per tenant; "
        "`elastic`: weighted fair shares with borrowing, priorities within a tenant, jobs started at their minimum "
        "and grown by throughput gained per worker, resizes through a checkpoint, a new job waiting for a "
        "completion due sooner than the restarts that shrinking others would cost. Times in hours; utilisation = "
        "slots held / slots that existed; goodput = useful worker-equivalents (scaling loss and restarts "
        "counted) / slots that existed; fairness = Jain's index of tenants' use over their fair shares while "
        "tenants contend; lost = GPU-hours of work trained twice; *vs FIFO* = mean completion time over FIFO's "
        "on the same trace; *run s* = the simulation's own run time.", "",
        "| trace | policy | mean JCT | p50 | p99 | mean wait | utilisation | goodput | fairness | restarts | lost | "
        "vs FIFO | run s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *lines, "",
        f"On the {main_label} trace the elastic policy's mean completion time is {ratios[main_label]:.2f}x FIFO's "
        f"({100 * (1 - ratios[main_label]):.0f}% lower); "
        + "; ".join(f"{label}: {ratio:.2f}x" for label, ratio in ratios.items() if label != main_label) + ". "
        "The four tenants' fair shares cost the mean: with the same jobs from one tenant the ratio is "
        f"{ratios[f'{args.jobs} jobs, load 0.9, one tenant']:.2f}x (tenant a sends 40% of the jobs and gets a "
        "quarter of a contended cluster, so its jobs wait on its share; FIFO ignores tenants). "
        "With a notice long enough for a checkpoint no work is trained twice under any policy; with none, "
        "each preemption loses the work since the last interval checkpoint (10 min).", "",
    ])
    replace_section(args.output, SECTION, section)
    print(section)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
