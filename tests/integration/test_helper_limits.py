"""Work on a tenant's input in the replica's helper processes is bounded (service/isolation.py):
a chat template that never finishes and a record that needs gigabytes are stopped at the
helper's time and memory limits with a 422 naming the field, and while one tenant's input
holds a helper, another tenant's create is served by another as fast as alone."""

from __future__ import annotations

import json
import threading
import time

import pytest

from eft.service import isolation
from eft.service.settings import get_settings
from eft.service.requests.prepare import helper_imports
from tests.helpers.app import tenant_client
from tests.helpers.hub import cached_model
from tests.helpers.paths import REPO

MODELS = REPO / "assets" / "models"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
#: A template that loops 10^10 times (Jinja's sandbox allows ranges of 10^5, not their nesting).
ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


@pytest.fixture
def hub_cache(tmp_path):
    """`acme/endless-template`: a hub model whose chat template never finishes rendering."""
    snapshot = cached_model(tmp_path / "hf-cache", "acme/endless-template", MODELS / "tiny-qwen2.5", COMMIT)
    config = json.loads((snapshot / "tokenizer_config.json").read_text())
    config["chat_template"] = ENDLESS
    (snapshot / "tokenizer_config.json").write_text(json.dumps(config))
    (snapshot / "chat_template.jinja").unlink(missing_ok=True)
    return tmp_path / "hf-cache"


@pytest.fixture
def limited(eft_home, hub_cache, monkeypatch):
    monkeypatch.setenv("EFT_ALLOW_HUB_MODELS", "true")
    monkeypatch.setenv("EFT_HUB_OFFLINE", "true")
    monkeypatch.setenv("EFT_HUB_CACHE_DIR", str(hub_cache))
    monkeypatch.setenv("EFT_HELPER_MEMORY_MB", "700")
    get_settings.cache_clear()


def _chat_file(eft_home, name: str, n: int = 4) -> str:
    (eft_home / "data" / name).write_text("".join(json.dumps({"messages": [
        {"role": "user", "content": f"{name}: what is {i} plus one?"},
        {"role": "assistant", "content": f"It is {i + 1}."}]}) + "\n" for i in range(n)))
    return name


def test_an_endless_chat_template_is_stopped_and_holds_no_other_tenant(limited, service, eft_home, monkeypatch):
    """Before: one model helper per replica with no time limit: the template held it, and every
    tenant's create behind it, for good."""
    client, store, settings = service
    isolation.warm(helper_imports, wait=True)  # a model helper up, as a replica warms it at start
    other = tenant_client(client.app, store, tenant="other")
    with other:
        def create(name):
            started = time.monotonic()
            r = other.post("/jobs", json={"model": "tiny-qwen2.5", "training_file": _chat_file(eft_home, name)})
            assert r.status_code == 201, r.text
            return time.monotonic() - started

        # Both model helpers started and each has loaded the model's tokenizer (as after two
        # tenants asked at once): each create is made while the other helper is held.
        helpers = isolation._pool("model")
        slots = [helpers.acquire(None, wait_s=60) for _ in range(helpers.size)]
        assert helpers.started == len(slots) == 2
        for turn, slot in enumerate(slots):
            helpers.release(slot, None)  # the only helper free: the create's
            create(f"warm-{turn}.jsonl")
            slots[turn] = helpers.acquire(None, wait_s=60)
        for slot in slots:
            helpers.release(slot, None)
        alone = min(create("alone-1.jsonl"), create("alone-2.jsonl"))
        # The limit, once the helpers have loaded what they keep (a first look at a model
        # imports its classes: seconds on a busy machine).
        monkeypatch.setenv("EFT_HELPER_TIME_S", "15")
        get_settings.cache_clear()
        hostile = {}

        def post_hostile():
            hostile["answer"] = client.post("/jobs", json={"model": "acme/endless-template",
                                                           "training_file": _chat_file(eft_home, "h.jsonl")})

        thread = threading.Thread(target=post_hostile)
        started = time.monotonic()
        thread.start()
        time.sleep(0.5)  # let the hostile render start before measuring the other tenant
        during = create("during.jsonl")
        thread.join(timeout=15 + 60)
        took = time.monotonic() - started
    print(f"another tenant's create: alone {alone:.3f} s, beside the endless template {during:.3f} s")
    assert during <= 3 * alone + 0.25, (during, alone)
    answer = hostile["answer"]
    assert answer.status_code == 422, answer.text
    (problem,) = answer.json()["error"]["errors"]
    assert problem["code"] == "input_too_costly" and problem["param"] == "training_file"
    assert "15 s" in problem["message"]
    assert took < 15 + 10
    # The killed helper was replaced: the next create that needs one is served.
    assert create("after.jsonl") < 60


def test_a_record_that_needs_too_much_memory_is_stopped(limited, service, eft_home):
    """A scan whose helper passes EFT_HELPER_MEMORY_MB (here one 300 MB record) is a 422
    naming the file; the replica's own memory is untouched and the next scan is served."""
    import resource

    client, store, settings = service
    big = eft_home / "data" / "big.jsonl"
    with open(big, "w") as f:
        f.write('{"text": "')
        for _ in range(300):
            f.write("x" * 2**20)
        f.write('"}\n')
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    refused = client.post("/jobs", json={"model": "tiny-llama", "training_file": "big.jsonl"})
    assert refused.status_code == 422, refused.text
    problems = refused.json()["error"]["errors"]
    assert [(p["param"], p["code"]) for p in problems] == [("training_file", "input_too_costly")], problems
    assert "700 MB" in problems[0]["message"]
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024 < 100
    ok = client.post("/jobs", json={"model": "tiny-llama", "training_file": _chat_file(eft_home, "fine.jsonl")})
    assert ok.status_code == 201, ok.text


ORPHANED = """
import sys, time
from eft.service import isolation
slot = isolation._Slot()
slot.executor.submit(exec, "while True: pass")  # a tenant's endless loop, in Python as a template's is
print(slot.pid, flush=True)
time.sleep(600)
"""


def test_a_helper_exits_when_its_replica_dies():
    """A replica killed while its helper renders an endless template (the replica's own limit
    never fires: it is gone) leaves no helper spinning on a core. Before: the helper ran on at
    100% CPU until the machine stopped."""
    import subprocess
    import sys

    import psutil

    from tests.helpers.jobs import until

    replica = subprocess.Popen([sys.executable, "-c", ORPHANED], stdout=subprocess.PIPE, text=True, cwd=REPO)
    helper = psutil.Process(int(replica.stdout.readline()))
    try:
        until("the helper to spin", lambda: helper.cpu_times().user > 0.5, timeout_s=30)
        replica.kill()
        replica.wait()

        def gone() -> bool:
            try:
                return helper.status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True

        until("the orphaned helper to exit", gone, timeout_s=15)
    finally:
        if helper.is_running():
            helper.kill()
