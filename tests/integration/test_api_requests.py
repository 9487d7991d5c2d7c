"""The REST surface over a real store: bad input gets one 422 naming every problem, and
nothing is stored for it; good input creates a `validating` job."""

import json

import pytest

from tests.helpers.app import service_app, validate_pending

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


@pytest.fixture
def data(eft_home):
    def write(name: str, lines: list) -> str:
        path = eft_home / "data" / name
        path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
        return name
    return write


def _problems(response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    body = response.json()["error"]
    assert body["type"] == "invalid_request_error" and body["code"] == "validation_failed"
    assert response.headers["x-request-id"]
    return {p["param"]: p["message"] for p in body["errors"]}


def _nothing_stored(client) -> None:
    assert client.get("/jobs").json()["data"] == []


def _nothing_stored_but(client, job_id: str) -> None:
    assert [j["id"] for j in client.get("/jobs").json()["data"]] == [job_id]


def test_minimal_request_creates_a_validating_job(client, data):
    train = data("train.jsonl", [CHAT] * 3)
    r = client.post("/jobs", json={"model": "tiny-llama", "training_file": train})
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["status"] == "validating" and job["id"].startswith("ftjob-")
    assert job["method"]["type"] == "lora" and job["strategy"] == "auto"
    assert client.get(f"/jobs/{job['id']}").json()["id"] == job["id"]
    assert [e["type"] for e in client.get(f"/jobs/{job['id']}/events").json()["data"]] == ["created"]


def test_idempotency_key_returns_the_same_job(client, data):
    body = {"model": "tiny-llama", "training_file": data("t.jsonl", [CHAT])}
    first = client.post("/jobs", json=body, headers={"Idempotency-Key": "abc"})
    second = client.post("/jobs", json=body, headers={"Idempotency-Key": "abc"})
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert len(client.get("/jobs").json()["data"]) == 1


def test_missing_dataset_and_unknown_model(client):
    problems = _problems(client.post("/jobs", json={"model": "no-such-model", "training_file": "nope.jsonl"}))
    assert "unknown model" in problems["model"] and "tiny-llama" in problems["model"]
    assert "not a file under an allowed data root" in problems["training_file"]
    _nothing_stored(client)


def test_malformed_jsonl_reports_line_numbers(client, data):
    train = data("bad.jsonl", [CHAT, "{oops", {"prompt": "p"}, {"messages": [{"role": "user", "content": "x"}]}])
    problems = _problems(client.post("/jobs", json={"model": "tiny-llama", "training_file": train}))
    assert any("line 2" in k and "not valid JSON" in v for k, v in problems.items())
    assert any("line 3" in k and "completion" in k for k in problems)
    assert any("line 4" in k and "no assistant message" in v for k, v in problems.items())
    _nothing_stored(client)


def test_unreadable_dataset(client, eft_home):
    (eft_home / "data" / "bin.jsonl").write_bytes(b"\xff\xfe\x00garbage")
    problems = _problems(client.post("/jobs", json={"model": "tiny-llama", "training_file": "bin.jsonl"}))
    assert "UTF-8" in problems["training_file"]


def test_path_outside_allowed_roots_is_refused(client, tmp_path):
    outside = tmp_path / "secret.jsonl"
    outside.write_text(json.dumps(CHAT) + "\n")
    for path in (str(outside), "../../secret.jsonl", "/etc/passwd"):
        problems = _problems(client.post("/jobs", json={"model": "tiny-llama", "training_file": path}))
        assert "allowed data root" in problems["training_file"]
    problems = _problems(client.post("/jobs", json={"model": "/etc", "training_file": "x.jsonl"}))
    assert "model" in problems
    _nothing_stored(client)


def test_impossible_numbers_all_reported_together(client, data):
    body = {
        "model": "tiny-llama",
        "training_file": data("t.jsonl", [CHAT]),
        "hyperparameters": {"learning_rate": -1, "micro_batch_size": 64, "global_batch_size": 8},
        "scaling": {"min_workers": 4, "max_workers": 2},
        "method": {"type": "lora", "r": 0},
    }
    problems = _problems(client.post("/jobs", json=body))
    assert "hyperparameters.learning_rate" in problems
    assert "must not exceed global_batch_size (8)" in problems["hyperparameters.micro_batch_size"]
    assert "min_workers (4) exceeds max_workers (2)" in problems["scaling.max_workers"]
    assert "method.lora.r" in problems
    _nothing_stored(client)


def test_schema_and_file_problems_come_in_one_response(client):
    body = {"model": "tiny-llama", "training_file": "missing.jsonl", "hyperparameters": {"learning_rate": 0}}
    problems = _problems(client.post("/jobs", json=body))
    assert {"hyperparameters.learning_rate", "training_file"} <= set(problems)


def test_unknown_field_is_named(client, data):
    body = {"model": "tiny-llama", "training_file": data("t.jsonl", [CHAT]), "learning_rate": 0.1,
            "hyperparameters": {"lr": 1}}
    problems = _problems(client.post("/jobs", json=body))
    assert "unknown field 'learning_rate'" in problems["learning_rate"]
    assert "unknown field" in problems["hyperparameters.lr"]
    _nothing_stored(client)


def test_missing_required_fields_and_bad_json(client):
    problems = _problems(client.post("/jobs", json={}))
    assert set(problems) == {"model", "training_file"}
    r = client.post("/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not valid JSON" in r.json()["error"]["message"] + json.dumps(r.json())


def test_unknown_strategy_and_too_many_workers(client, data):
    body = {"model": "tiny-llama", "training_file": data("t.jsonl", [CHAT]), "strategy": "zero4",
            "scaling": {"min_workers": 16}, "hyperparameters": {"global_batch_size": 8, "micro_batch_size": 1}}
    problems = _problems(client.post("/jobs", json=body))
    assert "zero3" in problems["strategy"]  # names the allowed values
    body["strategy"] = "zero3"
    problems = _problems(client.post("/jobs", json=body))
    assert "max_workers" in problems["hyperparameters.global_batch_size"]


def test_unknown_job_is_404_with_envelope(client):
    r = client.get("/jobs/ftjob-nope")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "job_not_found" and r.json()["error"]["param"] == "job_id"


def test_cancel_before_dispatch_and_twice(client, data):
    job = client.post("/jobs", json={"model": "tiny-llama", "training_file": data("t.jsonl", [CHAT])}).json()
    r = client.post(f"/jobs/{job['id']}/cancel")
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    again = client.post(f"/jobs/{job['id']}/cancel")
    assert again.status_code == 409 and again.json()["error"]["code"] == "job_already_finished"


def test_health_and_openapi(client):
    assert client.get("/healthz").json()["database"] is True
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/jobs", "/jobs/{job_id}", "/jobs/{job_id}/cancel", "/jobs/{job_id}/events",
            "/jobs/{job_id}/metrics", "/healthz"} <= set(paths)


def _big_model(eft_home) -> str:
    """A model directory holding only Llama-2-70B's config.json: enough for the planner."""
    model = eft_home / "models" / "llama-70b-config"
    model.mkdir(parents=True)
    model.joinpath("config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
        "intermediate_size": 28672, "num_attention_heads": 64, "num_hidden_layers": 80,
        "num_key_value_heads": 8, "vocab_size": 32000}))
    return str(model)


def test_job_that_cannot_fit_is_refused_with_the_nearest_fit(client, data, eft_home, monkeypatch):
    monkeypatch.setenv("EFT_GPU_MEMORY_GB", "32")
    client.app.state.job_service.settings.__dict__["gpu_memory_gb"] = 32.0
    body = {"model": _big_model(eft_home), "training_file": data("t.jsonl", [CHAT]),
            "scaling": {"min_workers": 2, "use_gpu": True}, "strategy": "ddp",
            "hyperparameters": {"max_seq_len": 4096, "micro_batch_size": 1}}
    r = client.post("/jobs", json=body)
    problems = _problems(r)
    message = " ".join(problems.values())
    assert "predicted not to fit" in message and "nearest that fits" in message
    assert any(p["code"] == "does_not_fit" for p in r.json()["error"]["errors"])
    _nothing_stored(client)


def test_incompatible_optimizations_are_named(client, data):
    body = {"model": "tiny-llama", "training_file": data("t.jsonl", [CHAT]), "strategy": "ddp",
            "optimizations": {"attention": "flash_attention_2", "offload": "optimizer"}}
    problems = _problems(client.post("/jobs", json=body))
    assert "GPUs only" in problems["optimizations.attention"]
    assert "zero1-3 or fsdp" in problems["optimizations.offload"]
    body = {"model": "tiny-llama", "training_file": data("t.jsonl", [CHAT]), "strategy": "zero2",
            "optimizations": {"offload": "optimizer+params"}}
    assert "zero3" in _problems(client.post("/jobs", json=body))["optimizations.offload"]


def test_forced_options_are_kept_and_auto_is_planned(client, data):
    from eft.service.requests.check import check_request
    from eft.types.jobs import JobCreate

    service = client.app.state.job_service
    train = data("t.jsonl", [CHAT])
    forced = JobCreate(model="tiny-llama", training_file=train, strategy="zero3",
                       optimizations={"offload": "optimizer+params", "gradient_checkpointing": True,
                                      "precision": "bf16", "attention": "eager"})
    choice = check_request(forced, service.settings).choice
    assert (choice.strategy, choice.offload, choice.gradient_checkpointing, choice.attention,
            choice.precision) == ("zero3", "optimizer+params", True, "eager", "bf16")
    auto = check_request(JobCreate(model="tiny-llama", training_file=train), service.settings).choice
    assert auto.strategy in ("ddp", "zero1", "zero2", "zero3", "fsdp") and auto.precision == "fp32"
    assert 0 < auto.predicted_memory_gb < 5
    qlora = check_request(JobCreate(model="tiny-llama", training_file=train, method={"type": "qlora"}),
                          service.settings).choice
    assert qlora.strategy == "ddp"


def test_the_job_is_planned_once_when_accepted_and_validated_with_that_plan(client, data):
    """The plan made on the request is stored with the job; validation builds the training
    config from it instead of planning again (here the stored plan is changed underneath: the
    config follows the stored one)."""
    import sqlalchemy as sa

    from eft.service.store.store import jobs
    from eft.service.requests.prepare import validate_job

    service = client.app.state.job_service
    job = client.post("/jobs", json={"model": "tiny-llama", "training_file": data("t.jsonl", [CHAT] * 4)}).json()
    stored = service.store.get_job(job["id"])
    assert stored.plan and stored.plan["strategy"] in ("ddp", "zero1", "zero2", "zero3", "fsdp")
    other = {**stored.plan, "strategy": "zero3" if stored.plan["strategy"] != "zero3" else "ddp",
             "predicted_memory_gb": 0.123}
    with service.store.engine.begin() as conn:
        conn.execute(sa.update(jobs).where(jobs.c.id == job["id"]).values(plan=other))
    config, _ = validate_job(service.store.get_job(job["id"]), service.settings)
    assert (config.strategy, config.predicted_memory_gb) == (other["strategy"], 0.123)


def test_recovery_and_elastic_options_are_checked_and_kept(client, data):
    train = data("train.jsonl", [CHAT] * 3)
    bad = client.post("/jobs", json={
        "model": "tiny-llama", "training_file": train,
        "scaling": {"min_workers": 1, "max_workers": 2, "resources": {"GPU": 1}},
        "checkpoint": {"every_seconds": 1}, "recovery": {"max_restarts": -1},
    })
    problems = _problems(bad)
    assert "custom resource" in problems["scaling.resources"] and "use_gpu" in problems["scaling.resources"]
    assert set(problems) >= {"checkpoint.every_seconds", "recovery.max_restarts"}
    _nothing_stored(client)

    good = client.post("/jobs", json={
        "model": "tiny-llama", "training_file": train,
        "scaling": {"min_workers": 1, "max_workers": 2, "resources": {"spot": 1}},
        "checkpoint": {"every_seconds": 600}, "recovery": {"max_restarts": 5},
    })
    assert good.status_code == 201, good.text
    job = good.json()
    assert job["scaling"]["resources"] == {"spot": 1.0} and job["recovery"]["max_restarts"] == 5
    assert job["checkpoint"]["every_seconds"] == 600
    assert (job["restarts"], job["preemptions"], job["resizes"], job["lost_steps"]) == (0, 0, 0, 0)

    # Only resources the operator allows (EFT_ALLOWED_WORKER_RESOURCES; "spot" by default):
    # never Ray's per-node resources, which would pin a job to a node of the tenant's choosing.
    for name in ("node:10.0.0.7", "accelerator_type:H100", "gpu-pool-b"):
        pinned = client.post("/jobs", json={"model": "tiny-llama", "training_file": train,
                                            "scaling": {"resources": {name: 1}}})
        problems = _problems(pinned)
        assert "EFT_ALLOWED_WORKER_RESOURCES" in problems[f"scaling.resources.{name}"], problems
    _nothing_stored_but(client, job["id"])


def test_a_dataset_edited_after_a_job_is_checked_again(client, data, eft_home):
    """Scans are remembered per file version: an edit (even to the same size) is seen."""
    name = data("edited.jsonl", [CHAT] * 2)
    assert client.post("/jobs", json={"model": "tiny-llama", "training_file": name}).status_code == 201
    path = eft_home / "data" / name
    good = path.read_text()
    bad = good.replace('"assistant"', '"assistent"', 1)
    assert len(bad) == len(good)
    path.write_text(bad)
    problems = _problems(client.post("/jobs", json={"model": "tiny-llama", "training_file": name}))
    assert any(param.startswith("training_file:line 1") for param in problems), problems


def test_a_created_job_calls_the_replicas_hook_once(eft_home, data):
    from fastapi.testclient import TestClient

    from eft.service.accounts.auth import KeyStore
    from eft.service.settings import get_settings
    from eft.service.store.store import Store

    settings, calls = get_settings(), []
    store = Store(settings.resolved_database_url)
    app = service_app(store, settings, on_created=lambda: calls.append(1))
    _, key = KeyStore(store.engine).create("default", "user", name="tests")
    body = {"model": "tiny-llama", "training_file": data("t.jsonl", [CHAT])}
    with TestClient(app, headers={"Authorization": f"Bearer {key}"}) as c:
        assert c.post("/jobs", json=body, headers={"Idempotency-Key": "k"}).status_code == 201
        assert c.post("/jobs", json=body, headers={"Idempotency-Key": "k"}).status_code == 200
        assert c.post("/jobs", json={**body, "model": "nope"}).status_code == 422
    store.close()
    assert calls == [1]


def test_a_priority_above_the_tenants_limit_is_refused_naming_it(data, service):
    from fastapi.testclient import TestClient

    from eft.service.settings import TenantShare

    _, store, settings = service
    capped = settings.model_copy(update={"tenant_shares": {"default": TenantShare(max_priority=50)}})
    train = data("train.jsonl", [CHAT] * 3)
    headers = dict(service[0].headers)
    with TestClient(service_app(store, capped), headers=headers) as capped_client:
        for priority in ("high", 51):
            problems = _problems(capped_client.post("/jobs", json={"model": "tiny-llama", "training_file": train,
                                                                   "priority": priority}))
            assert "tenant 'default''s limit, 50" in problems["priority"] and "EFT_TENANT_SHARES" in problems["priority"]
        _nothing_stored(capped_client)
        for priority in ("normal", 50, "low"):
            r = capped_client.post("/jobs", json={"model": "tiny-llama", "training_file": train, "priority": priority})
            assert r.status_code == 201, r.text


def test_priority_is_kept_and_a_bad_one_is_named(client, data, service):


    train = data("train.jsonl", [CHAT] * 3)
    problems = _problems(client.post("/jobs", json={"model": "tiny-llama", "training_file": train, "priority": "urgent"}))
    assert "priority" in problems and "low" in problems["priority"]
    problems = _problems(client.post("/jobs", json={"model": "tiny-llama", "training_file": train, "priority": 101}))
    assert "priority" in problems
    _nothing_stored(client)
    r = client.post("/jobs", json={"model": "tiny-llama", "training_file": train, "priority": "high"})
    assert r.status_code == 201 and r.json()["priority"] == "high" and r.json()["queue"] is None
    _, store, settings = service
    validate_pending(store, settings)
    queued = client.get(f"/jobs/{r.json()['id']}").json()
    assert queued["status"] == "queued" and queued["priority"] == "high"
    assert queued["queue"]["position"] == 1 and queued["queue"]["reason"]
