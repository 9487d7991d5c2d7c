"""Work that would hold the interpreter for seconds runs in a helper process, under limits.

Scanning a dataset of hundreds of MB (and tokenising it for a validate-only report) is pure
Python: in a thread it still holds the GIL, and a replica's event loop, which needs the GIL for
every step of every request, then answers nothing else for the length of the scan. `run` hands
such work to a helper process of the replica (spawned on first use), so one tenant's big file
costs CPU on a core but never the other tenants' latency. The functions must be importable by
name and their arguments and results picklable.

Tenants do not trust each other, and what runs here is their input (a file, a chat template):
- each call has a time limit (`EFT_HELPER_TIME_S` on the request path, `EFT_HELPER_VALIDATE_TIME_S`
  for a job's validation) and a memory limit (`EFT_HELPER_MEMORY_MB`, the helper's resident
  memory): past either, the helper is killed, a fresh one takes its place for the next call,
  and the call fails with a 422 `input_too_costly` naming the field (a job's validation fails the
  job as a user error);
- a pool has several helpers (slots), one call in each at a time, and one tenant holds at most
  all but one of them, so another tenant always finds one within the limit's time.
"""

from __future__ import annotations

import contextvars
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, TypeVar

from eft.service.errors import Problem, RequestInvalid, ServiceError

T = TypeVar("T")
#: Helpers per pool. Scans of different requests run side by side; jobs are validated one at a
#: time (the scheduler's pass is sequential) by one helper, which keeps the tokenizers and
#: model inspections it loaded for the next job. The model helpers answer the request path's
#: questions about a model (its facts, whether its chat template takes a file's records): they
#: alone import torch and transformers for them. The grade helpers check and run a tenant's
#: reinforcement graders (service/requests/graders.py).
POOLS = {"scan": 2, "validate": 1, "model": 2, "grade": 2}
#: How often a call's helper is looked at (its memory, the time) while the call runs.
WATCH_S = 0.05

#: The tenant on whose behalf this request runs (set by the API's authentication).
tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("eft_helper_tenant", default=None)
#: True in a helper process: work it hands on runs there, inline (no pool of its own).
_in_helper = False


def _mark_helper(parent: int) -> None:
    """A helper's start: mark it, and have it exit once its replica (`parent`) is gone."""
    global _in_helper
    _in_helper = True
    threading.Thread(target=_exit_with, args=(parent,), name="eft-helper-orphan-watch", daemon=True).start()


#: How often a helper looks whether its replica is still there.
ORPHAN_CHECK_S = 1.0


def _exit_with(parent: int) -> None:
    """Exits this helper once `parent` (the replica that spawned it) is gone. The replica kills
    a helper past its limits, but a replica that dies itself (killed, crashed, a test process
    stopped) kills nothing: its helper would go on rendering a tenant's endless template on a
    core for good. A thread that wakes every second costs nothing; the main thread's Python
    loop gives it the interpreter within the switch interval."""
    while True:
        time.sleep(ORPHAN_CHECK_S)
        if os.getppid() != parent:
            os._exit(1)


class LimitExceeded(Exception):
    """A helper call passed its time or memory limit (the helper was killed)."""

    def __init__(self, what: str):
        super().__init__(what)
        self.what = what


class Busy(Exception):
    """No helper came free in time (every one is working on others' input)."""


class HelpersBusy(ServiceError):
    """503 with Retry-After: no helper came free within the call's time limit."""

    status_code = 503
    type = "server_error"
    code = "server_busy"

    def __init__(self, message: str):
        super().__init__(message)
        self.headers = {"Retry-After": "5"}


class _Slot:
    """One helper process, one call at a time."""

    def __init__(self) -> None:
        # spawn, not fork: a replica has threads (the scheduler, the event loop) to not copy.
        self.executor = ProcessPoolExecutor(max_workers=1, initializer=_mark_helper, initargs=(os.getpid(),),
                                            mp_context=multiprocessing.get_context("spawn"))
        self.pid = self.executor.submit(os.getpid).result()

    def rss(self) -> int:
        try:
            with open(f"/proc/{self.pid}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            import psutil

            try:
                return psutil.Process(self.pid).memory_info().rss
            except psutil.Error:
                return 0

    def kill(self) -> None:
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.executor.shutdown(wait=False, cancel_futures=True)


class _Pool:
    def __init__(self, name: str, size: int):
        self.name, self.size = name, size
        self.idle: list[_Slot] = []
        self.started = 0  # slots alive, idle or busy
        self.held: dict[str | None, int] = {}
        self.cond = threading.Condition()

    def _share(self, who: str | None) -> bool:
        if who is None or self.size == 1:
            return True
        return self.held.get(who, 0) < self.size - 1

    def acquire(self, who: str | None, wait_s: float) -> _Slot:
        """A free helper (started if none is), once `who` is within its share."""
        with self.cond:
            if not self.cond.wait_for(lambda: self._share(who) and (self.idle or self.started < self.size), wait_s):
                raise Busy(f"no helper of this server came free within {wait_s:g} s")
            self.held[who] = self.held.get(who, 0) + 1
            if self.idle:
                return self.idle.pop()
            self.started += 1
        try:
            return _Slot()
        except BaseException:
            self.release(None, who)
            raise

    def release(self, slot: _Slot | None, who: str | None) -> None:
        """Give `slot` back (None: it is gone, killed or broken)."""
        with self.cond:
            self.held[who] -= 1
            if not self.held[who]:
                del self.held[who]
            if slot is None:
                self.started -= 1
            else:
                self.idle.append(slot)
            self.cond.notify_all()


_pools: dict[str, _Pool] = {}
_lock = threading.Lock()


def _pool(name: str) -> _Pool:
    with _lock:
        if name not in _pools:
            _pools[name] = _Pool(name, POOLS[name])
        return _pools[name]


def _limits(pool: str) -> tuple[float, int]:
    from eft.service.settings import get_settings

    settings = get_settings()
    seconds = settings.helper_validate_time_s if pool == "validate" else settings.helper_time_s
    return seconds, settings.helper_memory_mb * 2**20


def _watch(future: Future, slot: _Slot, seconds: float, memory: int) -> Any:
    """The call's result, or LimitExceeded once it has run `seconds` or its helper holds more
    than `memory` bytes (then the helper is killed)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            return future.result(timeout=min(WATCH_S, max(0.0, deadline - time.monotonic())))
        except FutureTimeout:
            pass
        if slot.rss() > memory:
            slot.kill()
            raise LimitExceeded(f"it needed more than {memory // 2**20} MB of memory (EFT_HELPER_MEMORY_MB)")
        if time.monotonic() >= deadline:
            slot.kill()
            raise LimitExceeded(f"it took more than {seconds:g} s (EFT_HELPER_TIME_S)")


def run(fn: Callable[..., T], *args: Any, pool: str = "scan", param: str = "training_file", **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a helper process of `pool`; its exception, if any, is raised
    here. Past the call's time or memory limit, a RequestInvalid (422 `input_too_costly`)
    naming `param`. A helper that died on its own (killed for memory by the system) is
    replaced and the call made once more."""
    if _in_helper:
        return fn(*args, **kwargs)
    seconds, memory = _limits(pool)
    who, helpers = tenant.get(), _pool(pool)
    try:
        for attempt in (1, 2):
            slot: _Slot | None = helpers.acquire(who, wait_s=seconds)
            try:
                return _watch(slot.executor.submit(fn, *args, **kwargs), slot, seconds, memory)
            except LimitExceeded:
                slot = None
                raise
            except BrokenProcessPool:
                slot.kill()
                slot = None
                if attempt == 2:
                    raise
            finally:
                helpers.release(slot, who)
        raise AssertionError("unreachable")
    except Busy as exc:
        raise HelpersBusy(f"this server is checking other requests' input: {exc}; try again shortly") from None
    except LimitExceeded as exc:
        raise RequestInvalid(problems=[Problem(
            param, "input_too_costly", f"checking this input was stopped: {exc.what}, the most this server "
            "spends on one request's input; make it smaller (fewer or shorter records, a simpler chat template)")]) from None


def warm(imports: Callable[[], Any], wait: bool = False) -> None:
    """Start a validating and a model helper now, in the background (or, with `wait`, before
    returning), each running `imports` (what checking a job imports, named by the caller; this
    module imports nothing of the service's above it): spawning one (an interpreter, torch,
    transformers: seconds of CPU) would otherwise delay the first job a replica validates, and
    the first create that asks a model helper about the model. The second model helper and the
    scan helpers start on first use (when two tenants ask at once): warming them too would take
    that much CPU again from whatever the node runs meanwhile."""
    threads = [threading.Thread(target=run, args=(imports,), kwargs={"pool": pool},
                                name=f"eft-isolation-warm-{pool}", daemon=True)
               for pool in ("model", "validate")]
    for thread in threads:
        thread.start()
    for thread in threads if wait else ():
        thread.join()

