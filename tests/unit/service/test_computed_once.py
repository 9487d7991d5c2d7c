"""`ComputedOnce`: one computation per key however many threads ask at once; reads take no lock."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from eft.service.requests.model_support import ComputedOnce


def test_concurrent_first_calls_compute_once_and_share_the_value() -> None:
    calls: list[str] = []
    entered = threading.Event()
    release = threading.Event()

    def slow(key: str) -> object:
        calls.append(key)
        entered.set()
        release.wait(5)
        return object()

    cache = ComputedOnce(slow, maxsize=4)
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(cache, "m") for _ in range(16)]
        assert entered.wait(5)
        release.set()
        values = {id(f.result(timeout=5)) for f in futures}
    assert calls == ["m"] and len(values) == 1


def test_a_remembered_value_is_read_while_another_key_computes() -> None:
    release = threading.Event()

    def fn(key: str) -> str:
        if key == "slow":
            release.wait(5)
        return key.upper()

    cache = ComputedOnce(fn, maxsize=4)
    assert cache("fast") == "FAST"
    with ThreadPoolExecutor(2) as pool:
        slow = pool.submit(cache, "slow")
        # the lock is held by the slow computation; the remembered key answers at once
        assert pool.submit(cache, "fast").result(timeout=2) == "FAST"
        release.set()
        assert slow.result(timeout=5) == "SLOW"


def test_errors_are_not_remembered_and_old_keys_are_evicted() -> None:
    attempts: list[int] = []

    def flaky(n: int) -> int:
        attempts.append(n)
        if len(attempts) == 1:
            raise OSError("not yet")
        return n * 2

    cache = ComputedOnce(flaky, maxsize=2)
    with pytest.raises(OSError):
        cache(1)
    assert cache(1) == 2 and cache(1) == 2
    cache(2), cache(3)  # 1 is the oldest: evicted
    assert cache(1) == 2
    assert attempts == [1, 1, 2, 3, 1]
