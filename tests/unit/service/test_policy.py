"""The cluster scheduling policy (`eft.service.scheduling.policy.plan`): fair shares, priorities, elastic
sizes, placement and the reasons it gives."""

from __future__ import annotations

import pytest

from eft.service.scheduling.policy import PRIORITIES, Demand, Pool, Tenant, fair_shares, plan


def job(id: str, tenant: str = "a", lo: int = 1, hi: int = 4, at: float = 0.0, **kw) -> Demand:
    return Demand(id=id, tenant=tenant, min_workers=lo, max_workers=hi, arrival=at, **kw)


def sizes(decisions) -> dict[str, int]:
    return {i: d.workers for i, d in decisions.items()}


def test_fair_shares_split_by_weight_and_lend_what_a_tenant_cannot_use() -> None:
    assert fair_shares(8, {"a": 8, "b": 8}, {}) == {"a": 4, "b": 4}
    assert fair_shares(9, {"a": 9, "b": 9}, {"a": Tenant(weight=2)}) == pytest.approx({"a": 6, "b": 3})
    # b wants only 1: a borrows the rest.
    assert fair_shares(8, {"a": 8, "b": 1}, {}) == pytest.approx({"a": 7, "b": 1})
    # A guaranteed share comes first, the rest by weight.
    assert fair_shares(8, {"a": 8, "b": 8}, {"b": Tenant(guaranteed=6)}) == pytest.approx({"a": 2, "b": 6})


def test_two_tenants_with_equal_weights_get_half_each_under_contention() -> None:
    pools = [Pool("gpu", 8)]
    # Tenant a holds the whole cluster; b's two jobs arrive.
    decisions = plan(pools, [job("a1", "a", 1, 8, 0, workers=8), job("b1", "b", 1, 8, 1), job("b2", "b", 1, 8, 2)])
    used = {"a": decisions["a1"].workers, "b": decisions["b1"].workers + decisions["b2"].workers}
    assert used == {"a": 4, "b": 4}
    assert decisions["a1"].reason.startswith("shrink")
    assert decisions["a1"].because_of in {"b1", "b2"}
    # Alone again, a's job takes the cluster back.
    assert sizes(plan(pools, [job("a1", "a", 1, 8, 0, workers=4)])) == {"a1": 8}


def test_a_high_priority_job_shrinks_an_elastic_job_never_below_its_minimum() -> None:
    pools = [Pool("gpu", 4)]
    elastic = job("e", lo=2, hi=4, workers=4)
    # Where e's minimum leaves room, e shrinks to it and the high-priority job runs beside it.
    decisions = plan(pools, [elastic, job("h", lo=2, hi=2, at=1, priority=PRIORITIES["high"])])
    assert sizes(decisions) == {"e": 2, "h": 2}
    assert decisions["e"].because_of == "h" and decisions["e"].reason.startswith("shrink")
    # When h is done, e grows back.
    assert sizes(plan(pools, [job("e", lo=2, hi=4, workers=2)])) == {"e": 4}
    # Where it does not (h needs 3 of 4, e's minimum is 2), the lower-priority job is paused.
    decisions = plan(pools, [elastic, job("h", lo=3, hi=3, at=1, priority=PRIORITIES["high"])])
    assert sizes(decisions) == {"e": 0, "h": 3}
    assert decisions["e"].reason.startswith("paused") and decisions["e"].because_of == "h"
    # A job of the same priority does not push a running one out: it waits.
    decisions = plan(pools, [elastic, job("n", lo=3, hi=3, at=1)])
    assert sizes(decisions) == {"e": 4, "n": 0} and decisions["n"].reason.startswith("waiting")


def test_priority_orders_jobs_within_a_tenant_not_across_fair_shares() -> None:
    pools = [Pool("gpu", 4)]
    decisions = plan(pools, [job("a1", "a", 2, 2, 0, workers=2), job("b1", "b", 2, 2, 1, workers=2),
                             job("a2", "a", 2, 2, 2, priority=PRIORITIES["high"])])
    # a's high-priority job takes a's own share (a1 pauses), not b's.
    assert sizes(decisions) == {"a1": 0, "b1": 2, "a2": 2}


def test_a_job_whose_minimum_cannot_be_placed_waits_with_a_reason() -> None:
    pools = [Pool("a100", 2), Pool("h100", 8)]
    big = job("big", lo=4, hi=4, pools=frozenset({"a100"}))  # the planner says only a100 qualifies
    decisions = plan(pools, [big, job("small", lo=1, hi=1)])
    assert decisions["big"].workers == 0 and decisions["big"].reason.startswith("waiting")
    assert decisions["small"].workers == 1
    assert decisions["small"].placement == {"h100": 1} or decisions["small"].placement == {"a100": 1}


def test_the_minimum_goes_on_on_demand_and_growth_on_spot() -> None:
    pools = [Pool("spot", 6, spot=True), Pool("on-demand", 2)]
    decisions = plan(pools, [job("e", lo=2, hi=6)])
    assert decisions["e"].workers == 6
    assert decisions["e"].placement == {"on-demand": 2, "spot": 4}


def test_idle_slots_go_to_the_job_that_scales_best() -> None:
    pools = [Pool("gpu", 3)]
    flat = job("flat", lo=1, hi=3, speedup=(1.0, 1.1, 1.15))
    linear = job("linear", lo=1, hi=3, at=1, speedup=(1.0, 2.0, 3.0))
    assert sizes(plan(pools, [flat, linear])) == {"flat": 1, "linear": 2}


def test_a_running_job_does_not_grow_when_the_time_saved_would_not_pay_for_a_restart() -> None:
    pools = [Pool("gpu", 4)]
    nearly_done = job("d", lo=1, hi=4, workers=1, remaining_s=100.0)
    assert plan(pools, [nearly_done], resize_cost_s=60.0)["d"].workers == 1
    long_run = job("d", lo=1, hi=4, workers=1, remaining_s=36000.0)
    assert plan(pools, [long_run], resize_cost_s=60.0)["d"].workers == 4
    # A queued job starts at whatever size helps: no restart to pay for.
    assert plan(pools, [job("q", lo=1, hi=4, remaining_s=100.0)], resize_cost_s=60.0)["q"].workers == 4


def test_a_new_job_waits_for_a_completion_due_sooner_than_shrinking_would_pay() -> None:
    pools = [Pool("gpu", 4)]
    # The new job's worker fits only if e shrinks; f finishes in 60 s: the new job waits for f's
    # slots rather than make e pay two restarts (shrink now, grow back later; 60 s each).
    e = job("e", lo=1, hi=2, workers=2, remaining_s=36000.0)
    f = job("f", lo=2, hi=2, workers=2, remaining_s=60.0)
    new = job("n", lo=1, hi=1, at=1)
    decisions = plan(pools, [e, f, new], resize_cost_s=60.0)
    assert sizes(decisions) == {"e": 2, "f": 2, "n": 0}
    assert decisions["n"].reason.startswith("waiting: a running job finishes") and decisions["n"].because_of == "f"
    # Due later than the two restarts are worth: the room is made now.
    decisions = plan(pools, [e, job("f", lo=2, hi=2, workers=2, remaining_s=600.0), new], resize_cost_s=60.0)
    assert sizes(decisions) == {"e": 1, "f": 2, "n": 1}
    assert decisions["e"].reason.startswith("shrink") and decisions["e"].because_of == "n"
    # Unknown remaining work, or no restart cost: no waiting.
    assert plan(pools, [e, job("f", lo=2, hi=2, workers=2), new], resize_cost_s=60.0)["n"].workers == 1
    assert plan(pools, [e, f, new], resize_cost_s=0.0)["n"].workers == 1


def test_fifo_blocks_behind_its_head_and_static_partitions_by_tenant() -> None:
    pools = [Pool("gpu", 4)]
    jobs = [job("r", "a", 2, 2, 0, workers=2), job("head", "a", 4, 4, 1), job("next", "b", 1, 1, 2)]
    assert sizes(plan(pools, jobs, policy="fifo")) == {"r": 2, "head": 0, "next": 0}
    # Static: b's partition (2 slots) is its own, so b's job runs; a's head waits for a's half.
    assert sizes(plan(pools, jobs, policy="static")) == {"r": 2, "head": 0, "next": 1}


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="min_workers"):
        plan([Pool("gpu", 4)], [job("x", lo=3, hi=2)])
    with pytest.raises(ValueError, match="policy"):
        plan([Pool("gpu", 4)], [], policy="lottery")


def test_fair_order_takes_tenants_by_weighted_running_jobs_then_priority_then_age() -> None:
    from eft.service.scheduling.policy import fair_order

    queued = [job(f"a{i}", "a", 1, 1, i) for i in range(4)] + [job(f"b{i}", "b", 1, 1, 10 + i) for i in range(4)]
    # Equal weights: turns, the longest-waiting tenant first.
    assert [d.id for d in fair_order({}, queued)][:4] == ["a0", "b0", "a1", "b1"]
    # a weighs 2: two of a's for one of b's.
    order = [d.id for d in fair_order({}, queued, {"a": Tenant(weight=2)})]
    assert order[:6] == ["a0", "b0", "a1", "a2", "b1", "a3"]
    # Running jobs count: b already runs 2, so a goes first twice.
    assert [d.id for d in fair_order({"b": 2}, queued)][:3] == ["a0", "a1", "a2"]
    # A guaranteed job comes before any share: b is guaranteed 1 although a weighs 10.
    assert fair_order({"a": 0}, queued, {"a": Tenant(weight=10), "b": Tenant(guaranteed=1)})[0].id == "b0"
    # Within a tenant, priority before age.
    urgent = job("a9", "a", 1, 1, 99, priority=PRIORITIES["high"])
    assert [d.id for d in fair_order({}, queued + [urgent])][0] == "a9"
    # A tenant at its running limit goes after the others (until they reach theirs too).
    assert [d.id for d in fair_order({"a": 2}, queued, per_tenant_limit=2)][:3] == ["b0", "b1", "a0"]
    assert [d.id for d in fair_order({"a": 2}, queued, per_tenant_limit=4)][:3] == ["b0", "b1", "a0"]
    assert [d.id for d in fair_order({"a": 2}, queued, per_tenant_limit=3)][:4] == ["b0", "b1", "a0", "b2"]
