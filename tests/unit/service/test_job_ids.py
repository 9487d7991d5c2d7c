"""Job ids sort in the order one process made them, also within one millisecond."""

from __future__ import annotations

from eft.service.store import store
def test_ids_made_in_one_millisecond_sort_in_the_order_made(monkeypatch):
    monkeypatch.setattr(store.time, "time", lambda: 1_800_000_000.0)
    monkeypatch.setattr(store, "_last_id", [0, 0])
    ids = [store.new_job_id() for _ in range(200)]
    assert ids == sorted(ids) and len(set(ids)) == 200
    assert all(i.startswith(f"ftjob-{1_800_000_000_000:012x}") for i in ids)


def test_a_clock_that_steps_back_does_not_reorder_ids(monkeypatch):
    now = [1_800_000_000.5]
    monkeypatch.setattr(store.time, "time", lambda: now[0])
    monkeypatch.setattr(store, "_last_id", [0, 0])
    first = store.new_job_id()
    now[0] -= 3.0
    second = store.new_job_id()
    now[0] += 10.0
    third = store.new_job_id()
    assert first < second < third
    assert len(first) == len("ftjob-") + 20


def test_a_full_random_part_carries_into_the_next_millisecond(monkeypatch):
    monkeypatch.setattr(store.time, "time", lambda: 1_800_000_000.0)
    monkeypatch.setattr(store.secrets, "randbits", lambda bits: 0xFFFFFFFF)
    monkeypatch.setattr(store, "_last_id", [0, 0])
    a, b = store.new_job_id(), store.new_job_id()
    assert a < b and b == f"ftjob-{1_800_000_000_001:012x}00000000"
