"""Work that would hold the interpreter for seconds runs in a helper process.

Scanning a dataset of hundreds of MB (and tokenising it for a validate-only report) is pure
Python: in a thread it still holds the GIL, and a replica's event loop, which needs the GIL for
every step of every request, then answers nothing else for the length of the scan. `run` hands
such work to a process pool of the replica (spawned once, on first use), so one tenant's big
file costs CPU on a core but never the other tenants' latency. The functions must be
importable by name and their arguments and results picklable.
"""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, TypeVar

T = TypeVar("T")
#: Helper processes per replica: scans of different requests run side by side.
WORKERS = 2
_pool: ProcessPoolExecutor | None = None
_lock = threading.Lock()
#: True in a helper process: work it hands on runs there, inline (no pool of its own).
_in_helper = False


def _mark_helper() -> None:
    global _in_helper
    _in_helper = True


def _executor() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            # spawn, not fork: a replica has threads (the scheduler, the event loop) to not copy.
            _pool = ProcessPoolExecutor(max_workers=WORKERS, mp_context=multiprocessing.get_context("spawn"),
                                        initializer=_mark_helper)
        return _pool


def run(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a helper process; its exception, if any, is raised here. A
    helper that died (killed for memory) is replaced and the call made once more."""
    global _pool
    if _in_helper:
        return fn(*args, **kwargs)
    try:
        return _executor().submit(fn, *args, **kwargs).result()
    except BrokenProcessPool:
        with _lock:
            _pool = None
        return _executor().submit(fn, *args, **kwargs).result()
