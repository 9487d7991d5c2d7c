"""The python grader sandbox (`training/graders/sandbox.py`): a grader's code runs in a child
process with limits, and whatever it does (loop, allocate, open sockets, read secrets, crash)
comes back as an error on its own call while this process stays as it was."""

from __future__ import annotations

import os
import resource
import time
from functools import partial

import pytest

from eft.training.graders import SandboxLimits, run, run_python_grader

LIMITS = SandboxLimits(call_timeout_s=5.0, load_timeout_s=60.0, memory_mb=512)


def _one(source: str, sample: dict | None = None, item: dict | None = None, limits: SandboxLimits = LIMITS):
    return run_python_grader(source, [(sample or {"output_text": "x"}, item or {})], limits)[0]


def _children() -> list[int]:
    """This process's child processes that run the sandbox's child script."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"_sandbox_child" in command:
            found.append(int(pid))
    return found


def test_a_correct_grader_scores_a_batch_in_one_process():
    source = ("import os\n"
              "def grade(sample, item):\n"
              "    assert sample['output_json']['n'] == item['n']\n"
              "    return item['n'] / 10 + os.getpid() * 0\n"
              "def pid(sample, item):\n"
              "    return os.getpid()\n")
    pairs = [({"output_text": f'{{"n": {n}}}', "output_json": {"n": n}}, {"n": n}) for n in range(4)]
    assert [o.score for o in run_python_grader(source, pairs, LIMITS)] == [0.0, 0.1, 0.2, 0.3]
    pids = run_python_grader(source.replace("def grade", "def _grade").replace("def pid", "def grade"), pairs, LIMITS)
    assert len({o.score for o in pids}) == 1 and pids[0].score != os.getpid()


def test_an_infinite_loop_is_stopped_and_the_next_calls_still_run():
    source = "def grade(sample, item):\n    while item['n'] == 1:\n        pass\n    return item['n']"
    limits = SandboxLimits(call_timeout_s=0.5, load_timeout_s=60.0)
    started = time.monotonic()
    outcomes = run_python_grader(source, [({}, {"n": 0}), ({}, {"n": 1}), ({}, {"n": 2})], limits)
    assert time.monotonic() - started < 0.5 + 10  # the loop's 0.5 s, plus two interpreter starts
    assert [o.score for o in outcomes] == [0.0, None, 2.0]
    assert (outcomes[1].error, outcomes[1].kind) == ("timed out after 0.5 s", "timeout")


def test_cpu_time_is_limited_in_the_child():
    outcome = _one("def grade(sample, item):\n    while True:\n        pass",
                   limits=SandboxLimits(call_timeout_s=30.0, load_timeout_s=60.0, cpu_s=1))
    assert (outcome.error, outcome.kind) == ("timed out: used its 1 s of CPU time", "timeout")


def test_unbounded_allocation_is_stopped():
    outcome = _one("def grade(sample, item):\n    hoard = []\n    while True:\n        hoard.append(bytearray(10**7))",
                   limits=SandboxLimits(call_timeout_s=30.0, load_timeout_s=60.0, memory_mb=256))
    assert (outcome.error, outcome.kind) == ("exceeded the memory limit", "memory")


@pytest.mark.parametrize("call", ["socket.socket()", "socket.create_connection(('127.0.0.1', 80))",
                                  "socket.getaddrinfo('example.com', 443)"])
def test_network_access_is_refused(call):
    outcome = _one(f"import socket\ndef grade(sample, item):\n    {call}\n    return 1")
    assert (outcome.score, outcome.error, outcome.kind) == (None, "network access is not allowed", "network")


def test_the_parents_environment_and_files_are_out_of_reach(monkeypatch):
    monkeypatch.setenv("EFT_SECRET", "hunter2")
    environment = _one("import os\ndef grade(sample, item):\n"
                       "    assert os.environ.get('EFT_SECRET') is None, 'leaked'\n"
                       "    return len(os.environ)")
    assert environment.score == 8.0  # PATH, HOME, TMPDIR, LANG, LC_ALL and 3 thread counts
    parent = _one("import os\ndef grade(sample, item):\n    return open(f'/proc/{os.getppid()}/environ').read()")
    assert parent.kind == "forbidden" and f"/proc/{os.getpid()}/environ is not allowed" in parent.error
    assert "open of /etc/passwd is not allowed" in _one("def grade(s, i):\n    open('/etc/passwd')").error


@pytest.mark.parametrize("code, says", [
    ("import subprocess\n    subprocess.run(['true'])", "subprocess.Popen is not allowed"),
    ("import os\n    os.system('true')", "os.system is not allowed"),
    ("import os\n    os.fork()", "os.fork is not allowed"),
    ("import ctypes\n    ctypes.CDLL(None).getpid()", "ctypes.dlsym is not allowed"),
    ("import os, sysconfig\n    open(os.path.join(sysconfig.get_paths()['purelib'], 'evil.pth'), 'w')",
     "evil.pth is not allowed"),
    ("open('lib.so', 'wb')", "native library"),
])
def test_processes_native_code_and_writes_outside_its_directory_are_refused(code, says):
    outcome = _one(f"def grade(sample, item):\n    {code}\n    return 1")
    assert outcome.kind == "forbidden" and says in outcome.error


def test_its_own_directory_is_writable():
    outcome = _one("import tempfile\ndef grade(sample, item):\n"
                   "    with open('notes.txt', 'w') as f:\n        f.write('abc')\n"
                   "    with tempfile.TemporaryDirectory() as d:\n        pass\n"
                   "    return len(open('notes.txt').read())")
    assert outcome.score == 3.0


@pytest.mark.parametrize("body, kind, says", [
    ("raise ValueError('no answer')", "runtime", "ValueError: no answer (line 2: raise ValueError('no answer'))"),
    ("return float('nan')", "invalid_score", "grade returned nan, not a finite number"),
    ("return 'high'", "invalid_score", "grade returned str, not a number"),
    ("return True", "invalid_score", "grade returned bool, not a number"),
    ("import os\n    os._exit(3)", "crashed", "the grader's process exited with code 3"),
])
def test_a_failed_call_says_why(body, kind, says):
    outcome = _one(f"def grade(sample, item):\n    {body}")
    assert (outcome.score, outcome.kind, outcome.error) == (None, kind, says)


def test_a_long_error_message_is_truncated():
    outcome = _one("def grade(sample, item):\n    raise RuntimeError('x' * 100_000)")
    assert outcome.error.startswith("RuntimeError: xxx") and len(outcome.error) < 800


def test_source_that_fails_to_load_fails_every_call_once():
    outcomes = run_python_grader("import json\nTABLE = 1 / 0\ndef grade(s, i):\n    return 1", [({}, {})] * 3, LIMITS)
    assert {o.error for o in outcomes} == {"the grader failed to load: ZeroDivisionError: division by zero "
                                           "(line 2: TABLE = 1 / 0)"}


def test_the_run_response_reports_a_timeout_as_a_server_error():
    python = {"type": "python", "name": "p", "source": "def grade(sample, item):\n    while True:\n        pass"}
    runner = partial(run_python_grader, limits=SandboxLimits(call_timeout_s=0.5, load_timeout_s=60.0))
    errors = run(python, "x", python_runner=runner)["metadata"]["errors"]
    assert errors["python_grader_server_error"] and errors["python_grader_server_error_type"] == "timeout"
    assert not errors["python_grader_runtime_error"]


def test_the_parent_is_left_as_it_was():
    limits_before = [resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE)]
    outcomes = run_python_grader("def grade(sample, item):\n    while True:\n        pass",
                                 [({}, {})] * 2, SandboxLimits(call_timeout_s=0.3, load_timeout_s=60.0))
    assert [o.kind for o in outcomes] == ["timeout", "timeout"]
    assert _children() == []  # every child killed and reaped
    assert [resource.getrlimit(r) for r in (resource.RLIMIT_AS, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE)] \
        == limits_before
    assert _one("def grade(sample, item):\n    return 1").score == 1.0


@pytest.mark.parametrize("line, says", [
    ("b'{\"i\": 0, \"score\": \"lots\", \"s\": 0}\\n'", "sent a malformed result"),
    ("b'{\"i\": 0, \"score\": 1, \"s\": 0}\\n' + b'{\"i\": 0, \"score\": 1, \"s\": 0}\\n'", None),
    ("b'x' * 100_000", "sent a result over 65536 bytes"),
])
def test_a_forged_result_line_is_refused_not_trusted(line, says):
    # the grader's code shares the child's process: it can write to the result channel (fd 3)
    outcomes = run_python_grader(f"import os\ndef grade(sample, item):\n    os.write(3, {line})\n    return 0.5",
                                 [({}, {}), ({}, {})], LIMITS)
    if says is None:  # a well-formed forgery only scores its own grader: the second line is out of turn
        assert [o.score for o in outcomes] == [1.0, None] and outcomes[1].error == "sent a malformed result"
    else:
        assert (outcomes[0].score, outcomes[0].error, outcomes[0].kind) == (None, says, "crashed")
