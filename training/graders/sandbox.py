"""Running a `python` grader's code: in a child process, never in the caller's.

OpenAI runs a python grader's `grade(sample, item)` in a constrained environment: code under
256 KB, no network, 2 GB of memory, 1 GB of disk, 1-2 CPU cores, 2 minutes in all; an exception
or a value that is not a valid float scores 0 (graders guide, "Python graders"). Its image also
has numpy, scipy, pandas, rapidfuzz, nltk (with corpora), rouge-score and others; here the code
imports what this service's interpreter has installed (no nltk corpora).

`run_python_grader(source, pairs)` grades many (sample, item) pairs in one child process, which
amortises the interpreter's start (~50 ms) over a batch. The child (`_sandbox_child.py`, run as
`python -I -B` in a fresh temporary directory with an environment of a few fixed variables, so
nothing of this process's environment reaches it) limits its address space (`memory_mb`), CPU
seconds (`cpu_s`, by default the batch's whole time budget) and file sizes (`file_mb`) before
the grader's code runs, and refuses network, processes, ctypes and files outside its directory
through an audit hook (see its docstring for what that is worth). This process enforces the
wall clock: `load_timeout_s` to start and run the module body, then `call_timeout_s` for each
grade call; on a timeout it kills the child's process group, reports that call, and starts a new
child for the pairs after it. Results come back as one JSON line per call on a pipe, each at
most `max_line_bytes`.

Each outcome is a score or an error: the exception's type and message (truncated, with the line
of the grader it came from); "timed out after N s"; "exceeded the memory limit"; "network
access is not allowed"; a return value that is not a finite number; a child that died.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

CHILD = Path(__file__).with_name("_sandbox_child.py")
#: Outcome kinds that are the grader's own doing (OpenAI's `python_grader_runtime_error`); the
#: others (timeout, memory, crashed) are the environment's (`python_grader_server_error`).
RUNTIME_KINDS = ("runtime", "invalid_score", "network", "forbidden", "load")


@dataclass(frozen=True)
class SandboxLimits:
    call_timeout_s: float = 10.0
    """Wall-clock seconds for one grade call."""
    load_timeout_s: float = 30.0
    """Wall-clock seconds to start the interpreter and run the source's module body (imports)."""
    memory_mb: int = 2048
    """Address space of the child (RLIMIT_AS), as OpenAI's 2 GB."""
    cpu_s: int | None = None
    """CPU seconds of the child (RLIMIT_CPU); None: the batch's wall-clock budget."""
    file_mb: int = 1024
    """Largest file the grader may write in its directory (RLIMIT_FSIZE)."""
    max_line_bytes: int = 64 * 1024
    """Largest result line the child may send."""


@dataclass(frozen=True)
class PythonOutcome:
    """One grade call: `score`, or None with `error` and its `kind` (runtime, invalid_score,
    network, forbidden, load, timeout, memory, crashed)."""

    score: float | None
    error: str | None = None
    kind: str | None = None
    seconds: float = 0.0


def run_python_grader(source: str, pairs: Sequence[tuple[Mapping[str, Any], Any]],
                      limits: SandboxLimits = SandboxLimits()) -> list[PythonOutcome]:
    """Grade every (sample, item) pair with the source's `grade`, in order; never raises for
    anything the grader does. Samples and items must be JSON."""
    outcomes: list[PythonOutcome] = []
    while len(outcomes) < len(pairs):
        outcomes += _run_child(source, pairs[len(outcomes):], limits)
    return outcomes


def _run_child(source: str, pairs: Sequence[tuple[Mapping[str, Any], Any]],
               limits: SandboxLimits) -> list[PythonOutcome]:
    """Outcomes of a prefix of `pairs` (at least one): up to the first call the child does not
    answer."""
    cpu_s = limits.cpu_s or math.ceil(limits.load_timeout_s + limits.call_timeout_s * len(pairs)) + 1
    with tempfile.TemporaryDirectory(prefix="eft-grader-", ignore_cleanup_errors=True) as root:
        request = {"source": source, "pairs": [[sample, item] for sample, item in pairs], "root": root,
                   "limits": {"memory_bytes": limits.memory_mb << 20, "cpu_s": cpu_s,
                              "file_bytes": limits.file_mb << 20}}
        child = subprocess.Popen([sys.executable, "-I", "-B", str(CHILD)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=root,
                                 env=_environment(root), start_new_session=True, close_fds=True)
        try:
            return _converse(child, json.dumps(request).encode(), len(pairs), limits, cpu_s)
        finally:
            _stop(child)


def _converse(child: subprocess.Popen, request: bytes, count: int, limits: SandboxLimits,
              cpu_s: int) -> list[PythonOutcome]:
    try:
        child.stdin.write(request)  # type: ignore[union-attr]
        child.stdin.close()  # type: ignore[union-attr]
    except BrokenPipeError:
        pass  # it died at start: reading says how
    with _Lines(child.stdout.fileno(), limits.max_line_bytes) as lines:  # type: ignore[union-attr]
        return _read_outcomes(child, lines, count, limits, cpu_s)


def _read_outcomes(child: subprocess.Popen, lines: _Lines, count: int, limits: SandboxLimits,
                   cpu_s: int) -> list[PythonOutcome]:
    message, failure = lines.next(limits.load_timeout_s)
    if message is None or message.get("ready") is not True:
        if message is not None and isinstance(message.get("load_error"), str):
            outcome = PythonOutcome(None, f"the grader failed to load: {message['load_error']}",
                                    "memory" if message.get("kind") == "memory" else "load")
        else:
            timeout = f"timed out after {limits.load_timeout_s:g} s while loading"
            failed = _failed(child, failure or "malformed", limits, cpu_s, timeout)
            outcome = PythonOutcome(None, f"the grader failed to load: {failed.error}", failed.kind)
        return [outcome] * count  # every call would fail the same way
    outcomes: list[PythonOutcome] = []
    while len(outcomes) < count:
        message, failure = lines.next(limits.call_timeout_s)
        outcome = _outcome(message, len(outcomes)) if message is not None else None
        if outcome is None:
            timeout = f"timed out after {limits.call_timeout_s:g} s"
            return outcomes + [_failed(child, failure or "malformed", limits, cpu_s, timeout)]
        outcomes.append(outcome)
    return outcomes


def _outcome(message: dict[str, Any], index: int) -> PythonOutcome | None:
    """The outcome a result line reports, None when it is not a well-formed one for `index`
    (the grader's code shares the child's process, so it could write one)."""
    score, error, kind, seconds = (message.get(k) for k in ("score", "error", "kind", "s"))
    if message.get("i") != index or not isinstance(seconds, (int, float)):
        return None
    if isinstance(score, (int, float)) and not isinstance(score, bool) and math.isfinite(score) and error is None:
        return PythonOutcome(float(score), seconds=float(seconds))
    if score is None and isinstance(error, str) and isinstance(kind, str):
        return PythonOutcome(None, error[:2000], kind, float(seconds))
    return None


def _failed(child: subprocess.Popen, failure: str, limits: SandboxLimits, cpu_s: int,
            timeout_message: str) -> PythonOutcome:
    """The outcome of the call the child did not answer; stops the child."""
    code = _stop(child)  # after a timeout or a bad line, this kills it: only an "eof" code is its own
    if failure == "timeout":
        return PythonOutcome(None, timeout_message, "timeout")
    if failure == "too_long":
        return PythonOutcome(None, f"sent a result over {limits.max_line_bytes} bytes", "crashed")
    if failure == "malformed":
        return PythonOutcome(None, "sent a malformed result", "crashed")
    if code == -signal.SIGXCPU:
        return PythonOutcome(None, f"timed out: used its {cpu_s} s of CPU time", "timeout")
    if code == -signal.SIGXFSZ:
        return PythonOutcome(None, f"wrote a file over the limit of {limits.file_mb} MB", "crashed")
    if code == -signal.SIGKILL:
        return PythonOutcome(None, "was killed (out of memory?)", "memory")
    return PythonOutcome(None, f"the grader's process exited with code {code}", "crashed")


def _stop(child: subprocess.Popen) -> int:
    """Kill the child's process group (it may be running, exiting, or a zombie: its pid is not
    reused before `wait` reaps it) and return its exit code."""
    if child.returncode is None:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    code = child.wait()
    for stream in (child.stdin, child.stdout):
        if stream is not None and not stream.closed:
            stream.close()
    return code


def _environment(root: str) -> dict[str, str]:
    """The child's whole environment: nothing of this process's (its secrets) is passed on."""
    return {"PATH": os.defpath, "HOME": root, "TMPDIR": root, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class _Lines:
    """JSON lines from a pipe, each waited for up to a timeout."""

    def __init__(self, fd: int, max_bytes: int):
        self.fd, self.max_bytes, self.buffer = fd, max_bytes, b""
        os.set_blocking(fd, False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(fd, selectors.EVENT_READ)

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *exc: object) -> None:
        self.selector.close()

    def next(self, timeout_s: float) -> tuple[dict[str, Any] | None, str]:
        """(message, "") or (None, why): timeout, eof, too_long or malformed."""
        deadline = time.monotonic() + timeout_s
        while (newline := self.buffer.find(b"\n")) < 0:
            if len(self.buffer) > self.max_bytes:
                return None, "too_long"
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not self.selector.select(remaining):
                return None, "timeout"
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None, "eof"
            self.buffer += chunk
        if newline > self.max_bytes:
            return None, "too_long"
        line, self.buffer = self.buffer[:newline], self.buffer[newline + 1:]
        try:
            message = json.loads(line)
        except ValueError:
            return None, "malformed"
        return (message, "") if isinstance(message, dict) else (None, "malformed")
