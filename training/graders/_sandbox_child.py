"""The child side of the python grader sandbox (`sandbox.py` starts it; it is never imported).

Run as `python -I _sandbox_child.py` in an empty temporary directory with a minimal environment.
It reads one JSON request from stdin: {"source", "pairs": [[sample, item], ...], "limits": {...},
"root": <the temporary directory>}; then, before any of the grader's code runs, it limits itself
(address space, CPU seconds, file size), moves its protocol channel off fd 1 (so the grader's
prints cannot corrupt it) and installs an audit hook that refuses, for the rest of its life:
sockets and name lookups; looking up native functions or reading raw memory through ctypes, and
loading libraries from outside the Python installation; starting processes (subprocess,
os.system/exec*/spawn*/fork); signalling other processes; changing resource limits; writing,
renaming or deleting files outside the temporary directory, or writing native libraries in it;
reading files outside it and the Python installation. It then runs the source and writes one
JSON line per grade call: {"i", "score", "s"} or {"i", "error", "kind", "s"}.

An audit hook is not a security boundary (CPython's documentation says so); this is defence in
depth under the process limits, for a service that should also run graders as an unprivileged
user or in a container.
"""

import json
import linecache
import math
import numbers
import os
import resource
import sys
import sysconfig
import time
import traceback
from importlib import machinery

BLOCKED_PREFIXES = ("socket.", "subprocess.", "os.exec", "os.spawn", "os.posix_spawn",
                    "os.fork", "os.forkpty", "os.system", "os.kill", "os.killpg", "os.symlink", "os.link",
                    "resource.setrlimit", "resource.prlimit", "signal.pthread_kill", "pty.", "webbrowser.",
                    "urllib.Request", "http.client.", "ftplib.", "smtplib.", "imaplib.", "poplib.",
                    "nntplib.", "telnetlib.", "sys.remote_exec",
                    # ctypes may be imported (numpy does) and load installed libraries, not look up
                    # their functions or read raw memory
                    "ctypes.dlsym", "ctypes.call_function", "ctypes.cdata", "ctypes.string_at",
                    "ctypes.wstring_at", "ctypes.PyObj_FromPtr")
#: event -> (position of a path argument, position of its dir_fd argument or None), ...
WRITE_EVENTS = {"os.remove": ((0, 1),), "os.rmdir": ((0, 1),), "os.mkdir": ((0, 2),),
                "os.rename": ((0, 2), (1, 3)), "os.chmod": ((0, 2),), "os.chown": ((0, 3),),
                "os.utime": ((0, 3),), "os.truncate": ((0, None),), "shutil.rmtree": ((0, 1),)}
MAX_ERROR_CHARS = 500
EXTENSION_SUFFIXES = tuple(machinery.EXTENSION_SUFFIXES)


class SandboxViolation(PermissionError):
    pass


class Guard:
    """The audit hook: `violation` holds the last refusal, so a grade that fails after one is
    reported as what it tried."""

    def __init__(self, root: str):
        self.root = os.path.realpath(root)
        prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
                    *sysconfig.get_paths().values()}
        self.installation = tuple(os.path.realpath(p) for p in prefixes if p)
        self.readable = self.installation + (
            self.root, "/dev/null", "/dev/urandom", "/dev/zero", "/etc/localtime", "/usr/share/zoneinfo")
        self.violation = None

    def __call__(self, event, args):
        if event.startswith(BLOCKED_PREFIXES):
            self.refuse(event, "network access is not allowed" if event.startswith("socket.")
                        else f"{event} is not allowed in a grader")
        elif event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            writing = (mode is not None and any(c in str(mode) for c in "wax+")) or \
                (isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC))
            if isinstance(path, int):
                return  # a descriptor already open
            if writing and mode is None and not os.path.isabs(os.fsdecode(path)):
                # os.open does not report its dir_fd: a relative path could be anywhere
                self.refuse(event, "os.open of a relative path for writing is not allowed in a grader")
            self.check_path(event, path, None, writing)
        elif event in WRITE_EVENTS:
            for path_at, dir_fd_at in WRITE_EVENTS[event]:
                path = args[path_at]
                dir_fd = args[dir_fd_at] if dir_fd_at is not None and dir_fd_at < len(args) else None
                if isinstance(path, int) and event != "os.truncate":
                    self.refuse(event, f"{event} of a file descriptor is not allowed in a grader")
                if not isinstance(path, int):
                    self.check_path(event, path, dir_fd, True)
        elif event == "ctypes.dlopen" and args and isinstance(args[0], (str, bytes)) and "/" in os.fsdecode(args[0]):
            real = os.path.realpath(os.fsdecode(args[0]))
            if not inside(real, self.installation):
                self.refuse(event, f"{event} of {real} is not allowed in a grader (libraries load only "
                                   f"from the Python installation)")

    def check_path(self, event, path, dir_fd, writing):
        try:
            base = os.readlink(f"/proc/self/fd/{dir_fd}") if isinstance(dir_fd, int) and dir_fd >= 0 else ""
            real = os.path.realpath(os.path.join(base, os.fsdecode(path)))
        except (OSError, TypeError, ValueError):
            self.refuse(event, f"{event} of {path!r} is not allowed in a grader")
        if writing and real.endswith(EXTENSION_SUFFIXES):
            self.refuse(event, f"{event} of a native library ({real}) is not allowed in a grader")
        if not inside(real, (self.root,) if writing else self.readable):
            self.refuse(event, f"{event} of {real} is not allowed in a grader (it writes only in its working "
                               f"directory, and reads only there and in the Python installation)")

    def refuse(self, event, message):
        self.violation = message
        raise SandboxViolation(message)


def inside(path, roots):
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def limit(limits):
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (limits["file_bytes"], limits["file_bytes"]))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def describe(error, guard):
    if isinstance(error, MemoryError):
        return "memory", "exceeded the memory limit"
    if guard.violation is not None:
        return "network" if guard.violation.startswith("network") else "forbidden", guard.violation
    stack = traceback.StackSummary.extract(traceback.walk_tb(error.__traceback__), lookup_lines=False)
    frames = [f for f in stack if f.filename == "<grader>"]
    where = f" (line {frames[-1].lineno}: {frames[-1].line})" if frames else ""
    try:
        message = f"{type(error).__name__}: {error}"
    except Exception:  # an exception whose str() fails
        message = type(error).__name__
    if len(message) > MAX_ERROR_CHARS:
        message = message[:MAX_ERROR_CHARS - 3] + "..."
    return "runtime", message + where[:200]


def check_score(value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return f"grade returned {type(value).__name__}, not a number"
    if not math.isfinite(float(value)):
        return f"grade returned {float(value)}, not a finite number"
    return None


def main():
    request = json.loads(sys.stdin.buffer.read())
    channel = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")

    def send(message):
        line = (json.dumps(message) + "\n").encode()
        while line:
            line = line[os.write(channel, line):]

    limit(request["limits"])
    guard = Guard(request["root"])
    source = request["source"]
    linecache.cache["<grader>"] = (len(source), None, source.splitlines(True), "<grader>")
    sys.addaudithook(guard)
    namespace = {"__name__": "grader"}
    try:
        exec(compile(source, "<grader>", "exec", dont_inherit=True), namespace)
        grade = namespace.get("grade")
        if not callable(grade):
            raise NameError("the source defines no `grade` function")
    except BaseException as error:  # the grader's own code: report whatever it raised
        kind, message = describe(error, guard)
        send({"load_error": message, "kind": kind})
        return
    send({"ready": True})
    for i, (sample, item) in enumerate(request["pairs"]):
        guard.violation = None
        started = time.perf_counter()
        try:
            score = grade(sample, item)
            problem = check_score(score)
            result = {"score": float(score)} if problem is None else {"error": problem, "kind": "invalid_score"}
        except BaseException as error:
            kind, message = describe(error, guard)
            result = {"error": message, "kind": kind}
        send({"i": i, **result, "s": time.perf_counter() - started})


if __name__ == "__main__":
    main()
