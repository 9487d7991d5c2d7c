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
#: Helper processes per replica and pool: scans of different requests run side by side; jobs
#: are validated one at a time (the scheduler's pass is sequential) by one helper, which keeps
#: the tokenizers and model inspections it loaded for the next job.
#: The model helper answers the request path's questions about a model (its facts, whether
#: its chat template takes a file's records): it alone imports torch and transformers for them.
POOLS = {"scan": 2, "validate": 1, "model": 1}
_pools: dict[str, ProcessPoolExecutor] = {}
_lock = threading.Lock()
#: True in a helper process: work it hands on runs there, inline (no pool of its own).
_in_helper = False


def _mark_helper() -> None:
    global _in_helper
    _in_helper = True


def _executor(pool: str) -> ProcessPoolExecutor:
    with _lock:
        if pool not in _pools:
            # spawn, not fork: a replica has threads (the scheduler, the event loop) to not copy.
            _pools[pool] = ProcessPoolExecutor(max_workers=POOLS[pool], initializer=_mark_helper,
                                               mp_context=multiprocessing.get_context("spawn"))
        return _pools[pool]


def run(fn: Callable[..., T], *args: Any, pool: str = "scan", **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a helper process of `pool`; its exception, if any, is raised
    here. A helper that died (killed for memory) is replaced and the call made once more."""
    if _in_helper:
        return fn(*args, **kwargs)
    try:
        return _executor(pool).submit(fn, *args, **kwargs).result()
    except BrokenProcessPool:
        with _lock:
            _pools.pop(pool, None)
        return _executor(pool).submit(fn, *args, **kwargs).result()


def warm() -> None:
    """Start the validating and the model helpers now, in the background, with what checking a
    job imports: spawning one (an interpreter, torch, transformers: seconds of CPU) would
    otherwise delay the first job a replica validates, and the first create, which asks the
    model helper about the model. The scan helpers start on first use: warming them too would
    take that much CPU again from whatever the node runs meanwhile."""
    def start(pool: str) -> None:
        _executor(pool).submit(_import_validation).result()

    for pool in ("model", "validate"):
        threading.Thread(target=start, args=(pool,), name=f"eft-isolation-warm-{pool}", daemon=True).start()


def _import_validation() -> None:
    import transformers  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    import eft.service.model_support  # noqa: F401
    import eft.service.validation  # noqa: F401
    import eft.training.datacache  # noqa: F401
