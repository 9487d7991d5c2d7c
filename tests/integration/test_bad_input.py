"""Malformed requests get a 4xx with the error envelope and the request id, never a 5xx, and
store nothing: wrong content types, invalid UTF-8, huge numbers, deep nesting, unknown fields,
path traversal, unknown routes and methods, oversized bodies."""

import json

import pytest

CHAT = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}


def _envelope(r, *statuses):
    assert r.status_code in statuses, (r.status_code, r.text)
    error = r.json()["error"]
    assert {"type", "code", "message", "param"} <= set(error)
    assert r.headers["x-request-id"]
    return error


@pytest.fixture
def train(eft_home):
    (eft_home / "data" / "t.jsonl").write_text(json.dumps(CHAT) + "\n")
    (eft_home / "outside.jsonl").write_text(json.dumps(CHAT) + "\n")
    (eft_home / "data" / "link.jsonl").symlink_to(eft_home / "outside.jsonl")
    return "t.jsonl"


BODIES = [
    ("text/plain", b"model=tiny-llama"),
    ("application/json", b"\xff\xfe{\"model\": 1}"),
    ("application/json", b"{not json"),
    ("application/json", b"[" * 5000 + b"]" * 5000),
    ("application/json", json.dumps({"model": "tiny-llama", "training_file": "t.jsonl",
                                     "hyperparameters": {"max_steps": 10**400}}).encode()),
    ("application/json", json.dumps({"model": "tiny-llama", "training_file": "t.jsonl",
                                     "hyperparameters": {"learning_rate": 1e308 * 10}}).encode()),
    ("application/json", json.dumps({"model": "tiny-llama", "training_file": "t.jsonl",
                                     "surprise": True}).encode()),
    # Python's json writes (and FastAPI reads) Infinity and NaN; no setting means them.
    ("application/json", json.dumps({"model": "tiny-llama", "training_file": "t.jsonl",
                                     "method": {"type": "lora", "alpha": float("inf")}}).encode()),
    ("application/json", json.dumps({"model": "tiny-llama", "training_file": "t.jsonl",
                                     "hyperparameters": {"weight_decay": float("nan")}}).encode()),
]


@pytest.mark.parametrize("content_type,body", BODIES)
def test_malformed_job_bodies_are_4xx_and_store_nothing(client, train, content_type, body):
    r = client.post("/jobs", content=body, headers={"Content-Type": content_type})
    _envelope(r, 400, 415, 422)
    assert client.get("/jobs").json()["data"] == []


@pytest.mark.parametrize("path", ["../../etc/passwd", "/etc/passwd", "link.jsonl", "a/../../t.jsonl",
                                  "~root/x.jsonl", "x" * 5000, "file-" + "0" * 24])
def test_paths_outside_the_data_roots_are_refused(client, train, path):
    r = client.post("/jobs", json={"model": "tiny-llama", "training_file": path})
    error = _envelope(r, 422)
    assert error["errors"][0]["param"].startswith("training_file")
    assert client.get("/jobs").json()["data"] == []


def test_unknown_routes_methods_and_ids_use_the_envelope(client):
    assert _envelope(client.get("/nope"), 404)["code"] == "not_found"
    assert _envelope(client.put("/jobs"), 405)["code"] == "method_not_allowed"
    assert _envelope(client.get("/jobs/ftjob-nope"), 404)["code"] == "job_not_found"
    assert _envelope(client.get("/jobs", params={"limit": 10**30}), 422)
    assert _envelope(client.get("/v1/fine_tuning/jobs/ftjob-nope"), 404)


def test_an_oversized_json_body_is_413(client, train):
    r = client.post("/jobs", content=b'{"model": "' + b"x" * (2 * 1024**2) + b'"}',
                    headers={"Content-Type": "application/json"})
    assert _envelope(r, 413)["code"] == "payload_too_large"
    assert client.get("/jobs").json()["data"] == []


#: Digits `str.isdigit` passes that `int` does not read ('²'), or reads though no client sends
#: them ('٣'), and more digits than Python reads at all.
NOT_DECIMAL = ["²", "٣", "9" * 5000]


@pytest.mark.parametrize("step", NOT_DECIMAL)
def test_a_step_in_other_digits_is_a_4xx_naming_the_field(client, train, step):
    r = client.post("/jobs", json={"model": "tiny-llama", "training_file": train,
                                   "from_checkpoint": f"ftjob-0123456789abcdef0123:{step}"})
    assert _envelope(r, 422)["errors"][0]["param"] == "from_checkpoint"
    model_id = f"ft:tiny-llama:default:ftjob-0123456789abcdef0123:ckpt-{step}"
    r = client.post("/jobs", json={"model": model_id, "training_file": train})
    assert _envelope(r, 404, 422)
    r = client.post("/v1/fine_tuning/jobs", json={"model": model_id, "training_file": train})
    assert _envelope(r, 404, 422)
    r = client.post("/v1/chat/completions", json={"model": model_id, "messages": [{"role": "user", "content": "hi"}]})
    assert _envelope(r, 404, 422)
    assert _envelope(client.get(f"/v1/models/{model_id}"), 404)
    assert client.get("/jobs").json()["data"] == []



def _job(train: str, **fields) -> dict:
    return {"model": "tiny-llama", "training_file": train, **fields}


#: Bodies the service answered 500 to, or stored unbounded: each now a 422 naming the field.
BOUNDED = [
    ("name", _job("t.jsonl", name="a\x00b")),
    ("metadata", _job("t.jsonl", metadata={"k": "x" * 100_000})),
    ("metadata", _job("t.jsonl", metadata={"k" * 65: "v"})),
    ("metadata", _job("t.jsonl", metadata={"k": "a\x00b"})),
    ("integrations", _job("t.jsonl", integrations=[{"type": "wandb", "wandb": json.loads("[" * 900 + "]" * 900)}])),
    ("integrations", _job("t.jsonl", integrations=[{"type": "wandb", "wandb": {"project": "p" * 20_000}}])),
    ("hyperparameters.warmup_steps", _job("t.jsonl", hyperparameters={"warmup_steps": 10**30})),
    ("hyperparameters.log_every_steps", _job("t.jsonl", hyperparameters={"log_every_steps": 10**30})),
    ("checkpoint.every_steps", _job("t.jsonl", checkpoint={"every_steps": 10**30})),
    ("eval.every_steps", _job("t.jsonl", eval={"every_steps": 10**30})),
]


@pytest.mark.parametrize("field,body", BOUNDED, ids=[f"{f}-{i}" for i, (f, _) in enumerate(BOUNDED)])
def test_unbounded_or_unstorable_fields_are_a_4xx_naming_them(client, train, field, body):
    error = _envelope(client.post("/jobs", json=body), 422)
    assert error["errors"][0]["param"].startswith(field), error
    assert client.get("/jobs").json()["data"] == []


OPENAI_BOUNDED = [
    ("suffix", {"suffix": "a\x00b"}),
    ("metadata", {"metadata": {"k": "x" * 513}}),
    ("integrations", {"integrations": [{"type": "wandb", "wandb": {"project": "p", "tags": ["t" * 65]}}]}),
]


@pytest.mark.parametrize("field,extra", OPENAI_BOUNDED, ids=[f for f, _ in OPENAI_BOUNDED])
def test_openai_creates_bound_their_labels(client, train, field, extra):
    error = _envelope(client.post("/v1/fine_tuning/jobs", json={"model": "tiny-llama", "training_file": train,
                                                                **extra}), 422)
    assert error["errors"][0]["param"].startswith(field), error


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
@pytest.mark.parametrize("field,value", [("seed", 2**64), ("max_tokens", 10**30)])
def test_sampling_numbers_beyond_their_range_are_a_4xx(client, path, field, value):
    body = {"model": "tiny-llama", field: value,
            **({"prompt": "hi"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "hi"}]})}
    assert _envelope(client.post(path, json=body), 422)["errors"][0]["param"] == field


@pytest.mark.parametrize("url", ["https://[::1/", "https://[::1]:99999/", "http://exa mple.com/"])
def test_a_malformed_webhook_url_is_a_4xx_naming_it(client, url):
    error = _envelope(client.post("/webhooks", json={"url": url}), 422)
    assert error["param"] == "url" or error["errors"][0]["param"] == "url", error
