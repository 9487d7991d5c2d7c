"""The API's process answers every request without importing torch or transformers: what needs
a model (its facts, its tokenizer and chat template, a dataset's token counts) runs in the
replica's helper processes (service/isolation.py). Their million objects in the replica would
make each full garbage collection a pause of 100-200 ms that every request waits behind."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


# Run in a fresh interpreter: this test process has imported torch for other tests.
SCRIPT = textwrap.dedent("""
    import json, sys
    from fastapi.testclient import TestClient
    from eft.api.app import create_app
    from eft.service.accounts.auth import KeyStore
    from eft.service.jobs.manager import JobService
    from eft.service.runs.launcher import RayJobsLauncher
    from eft.service.settings import get_settings
    from eft.service.store.store import Store

    settings = get_settings()
    store = Store(settings.resolved_database_url)
    app = create_app(JobService(store, RayJobsLauncher(settings), settings))
    _, key = KeyStore(store.engine).create("acme", "user", name="tests")
    out = {"imported_at_start": [m for m in ("torch", "transformers") if m in sys.modules]}
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as client:
        job = {"model": "tiny-qwen3", "training_file": "chat.jsonl"}
        created = client.post("/jobs", json=job)
        out["create"] = created.status_code, created.json()
        out["get"] = client.get(f"/jobs/{created.json()['id']}").status_code
        out["plan"] = client.post("/plan", json={**job, "cluster": {"gpus": 2, "gpu_memory_gb": 24}}).status_code
        refused = client.post("/jobs", json={"model": "tiny-gemma-2", "training_file": "system.jsonl"})
        out["refused"] = refused.status_code, refused.json()
        upload = client.post("/files", files={"file": ("up.jsonl", open(sys.argv[1], "rb"))})
        report = client.post(f"/files/{upload.json()['id']}/validate", json={"model": "tiny-qwen3"})
        out["report"] = report.status_code, report.json()
    out["imported"] = [m for m in ("torch", "transformers", "tokenizers") if m in sys.modules]
    print(json.dumps(out))
""")


def test_requests_on_real_model_families_import_no_torch_in_the_api_process(eft_home):
    turns = [{"role": "user", "content": "What is one plus one?"}, {"role": "assistant", "content": "Two."}]
    system = {"role": "system", "content": "Be brief."}
    (eft_home / "data" / "chat.jsonl").write_text(json.dumps({"messages": turns}) + "\n")
    # Gemma 2's template refuses a system turn: the request path renders it with that template.
    (eft_home / "data" / "system.jsonl").write_text(json.dumps({"messages": [system, *turns]}) + "\n")
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(eft_home / "data" / "chat.jsonl")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    status, job = out["create"]
    assert status == 201, job
    assert job["status"] == "validating" and job["model"] == "tiny-qwen3"
    assert out["get"] == 200 and out["plan"] == 200
    status, body = out["refused"]
    assert status == 422, body
    assert body["error"]["errors"][0]["param"] == "training_file:line 1:messages"
    status, report = out["report"]
    assert status == 200, report
    assert report["ok"] and report["records"] == 1 and report["tokens"]["loss_tokens"] > 0, report
    assert out["imported_at_start"] == [] and out["imported"] == []
