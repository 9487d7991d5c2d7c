"""POST /plan through the real app: the same object the CLI prints, models resolved only from the
registry or under the allowed model roots, and 422s in the error envelope.

Run: .venv/bin/python -m pytest tests/integration/test_plan_api.py -q
"""

import json
import shutil

import pytest

from eft.types.plans import PlanRequest
from eft.cli.plan import plan_locally
from eft.service.settings import get_settings
from tests.helpers.paths import REPO

TINY = REPO / "assets" / "models" / "tiny-llama"
STUDY_EXAMPLE = {"model": "llama-2-70b", "method": {"type": "lora"},
                 "hyperparameters": {"max_seq_len": 4096, "micro_batch_size": 1},
                 "cluster": {"gpus": 8, "gpu_memory_gb": 32}}


def _problems(response) -> dict[str, str]:
    assert response.status_code == 422, response.text
    body = response.json()["error"]
    assert body["type"] == "invalid_request_error" and body["code"] == "validation_failed"
    return {p["param"]: p["message"] for p in body["errors"]}


def test_plan_returns_the_study_choice_and_the_same_object_as_the_cli(client):
    r = client.post("/plan", json=STUDY_EXAMPLE)
    assert r.status_code == 200, r.text
    body = r.json()
    chosen = body["chosen"]
    assert (chosen["strategy"], chosen["gradient_checkpointing"]) == ("zero3", True)
    assert set(chosen["memory_gb"]) == {"parameters", "gradients", "optimizer", "activations",
                                        "overhead", "reserve", "communicator", "total"}
    memory = chosen["memory_gb"]  # 8 GPUs: the allocator's reserve and NCCL's buffers are planned for
    assert memory["reserve"] > 0 and memory["communicator"] > 0 and memory["total"] <= 32
    assert len(body["candidates"]) == 20 and body["suggestions"] == []
    assert body == plan_locally(PlanRequest.model_validate(STUDY_EXAMPLE)).model_dump(mode="json")


def test_a_job_body_with_its_files_is_accepted_and_nothing_is_stored(client):
    job = {**STUDY_EXAMPLE, "training_file": "train.jsonl", "name": "x", "strategy": "zero3"}
    r = client.post("/plan", json=job)
    assert r.status_code == 200, r.text
    assert {c["strategy"] for c in r.json()["candidates"]} == {"zero3"}
    assert client.get("/jobs").json()["data"] == []


def test_bundled_and_home_models_resolve_under_the_allowed_roots(client, eft_home):
    cluster = {"gpus": 1, "gpu_memory_gb": 8, "gpu_type": "A10"}
    r = client.post("/plan", json={"model": "tiny-llama", "cluster": cluster})
    assert r.status_code == 200, r.text
    assert r.json()["model"]["parameters"] == 897_408
    mine = eft_home / "models" / "my-model"
    mine.mkdir(parents=True)
    shutil.copy(TINY / "config.json", mine / "config.json")
    for name in ("my-model", str(mine), str(mine / "config.json")):
        r = client.post("/plan", json={"model": name, "cluster": cluster})
        assert r.status_code == 200, (name, r.text)
        assert r.json()["model"]["parameters"] == 897_408


def test_models_outside_the_roots_are_refused(client, tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    shutil.copy(TINY / "config.json", outside / "config.json")
    cluster = {"gpus": 1, "gpu_memory_gb": 8}
    for name in (str(outside), "../../etc", "no-such-model"):
        problems = _problems(client.post("/plan", json={"model": name, "cluster": cluster}))
        assert "unknown model" in problems["model"] and "llama-2-70b" in problems["model"]


def test_a_broken_config_is_a_422_on_model(client, eft_home):
    broken = eft_home / "models" / "broken"
    broken.mkdir(parents=True)
    (broken / "config.json").write_text(json.dumps({"hidden_size": 64}))
    problems = _problems(client.post("/plan", json={"model": "broken",
                                                    "cluster": {"gpus": 1, "gpu_memory_gb": 8}}))
    assert "lacks num_hidden_layers" in problems["model"]


def test_unknown_lora_target_and_missing_cluster(client):
    body = {**STUDY_EXAMPLE, "method": {"type": "lora", "target_modules": ["q_proj", "attn"]}}
    assert "has no module attn" in _problems(client.post("/plan", json=body))["method.target_modules"]
    no_cluster = {k: v for k, v in STUDY_EXAMPLE.items() if k != "cluster"}
    assert _problems(client.post("/plan", json=no_cluster))["cluster"] == "cluster is required"
    bad_gpus = {**STUDY_EXAMPLE, "cluster": {"gpus": 0, "gpu_memory_gb": 32}}
    assert "cluster.gpus" in _problems(client.post("/plan", json=bad_gpus))


def test_forced_strategy_that_cannot_fit_gets_the_nearest_fit(client):
    r = client.post("/plan", json={**STUDY_EXAMPLE, "strategy": "zero2"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["chosen"] is None
    first = body["suggestions"][0]
    assert (first["change"], first["value"]) == ("strategy", "auto")
    assert first["chosen"]["strategy"] == "zero3" and first["chosen"]["gradient_checkpointing"]


def test_a_job_that_cannot_fit_is_refused_naming_the_nearest_fit(eft_home):
    from eft.types.jobs import JobCreate
    from eft.types.plans import Cluster
    from eft.service.errors import RequestInvalid
    from eft.planner import plan
    from eft.service.requests.plan import refuse_unless_fits, spec_for_request

    job = JobCreate.model_validate({"model": "llama-2-70b", "training_file": "t.jsonl",
                                    "strategy": "zero2", "hyperparameters": {"max_seq_len": 4096,
                                                                             "micro_batch_size": 1}})
    spec = spec_for_request(job, Cluster(gpus=8, gpu_memory_gb=32), get_settings())
    with pytest.raises(RequestInvalid) as info:
        refuse_unless_fits(plan(spec))
    problem = info.value.problems[0]
    assert (problem.param, problem.code) == ("strategy", "does_not_fit")
    assert "nearest that fits: let the planner choose the strategy (auto): zero3" in problem.message
    refuse_unless_fits(plan(spec_for_request(job.model_copy(update={"strategy": "auto"}),
                                             Cluster(gpus=8, gpu_memory_gb=32), get_settings())))
