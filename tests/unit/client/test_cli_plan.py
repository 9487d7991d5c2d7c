"""`eft plan` and `client.plan`: the JSON contract, the study's 70B example, local and remote.

Locally the planner runs in-process (no server); `--remote` and the client go through an
httpx.MockTransport fake of POST /plan.

Run: .venv/bin/python -m pytest tests/unit/client/test_cli_plan.py -q
"""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest
from typer.testing import CliRunner

from eft.types.plans import Plan
from eft import AsyncClient, Client
from eft.cli import main as cli
from eft.cli import output
from eft.cli import plan as cli_plan
from tests.helpers.paths import REPO

TINY = REPO / "assets" / "models" / "tiny-llama"
STUDY_EXAMPLE = ("plan", "--model", "llama-2-70b", "--method", "lora", "--gpus", "8",
                 "--gpu-memory", "32", "--seq-len", "4096")
CANDIDATE_KEYS = {"strategy", "offload", "gradient_checkpointing", "attention", "fits",
                  "relative_time", "memory_gb", "reason"}
MEMORY_KEYS = {"parameters", "gradients", "optimizer", "activations", "overhead", "reserve", "communicator", "total"}
runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(cli.app, list(args))


def plan_json(*args: str, exit_code: int = 0) -> dict:
    result = invoke(*args, "--json")
    assert result.exit_code == exit_code, result.output
    return json.loads(result.stdout)


def test_study_example_chooses_zero3_lora_with_gradient_checkpointing():
    body = plan_json(*STUDY_EXAMPLE)
    chosen = body["chosen"]
    # Figure 4, Llama 2 70B at 4096 tokens on 8 V100 32 GB: "Zero-3 LoRA GC".
    assert (chosen["strategy"], chosen["gradient_checkpointing"], chosen["offload"],
            chosen["attention"]) == ("zero3", True, "none", "sdpa")
    assert chosen["fits"] and chosen["memory_gb"]["total"] <= 32
    assert chosen["reason"].startswith("chosen: the fastest configuration that fits")
    assert [line.split(" (")[0] for line in body["why"]] == ["zero3", "gradient checkpointing"]
    assert body["model"]["name"] == "llama-2-70b" and body["model"]["method"] == "lora"


def test_json_contract_of_every_candidate():
    body = plan_json(*STUDY_EXAMPLE)
    assert {"chosen", "candidates"} <= set(body)
    assert body["candidates"][0] == body["chosen"]
    for c in body["candidates"]:
        assert set(c) == CANDIDATE_KEYS
        assert set(c["memory_gb"]) == MEMORY_KEYS
        assert c["strategy"] in {"ddp", "fsdp", "zero1", "zero2", "zero3"}
        assert c["offload"] in {"none", "optimizer", "optimizer+params"}
        assert isinstance(c["gradient_checkpointing"], bool) and isinstance(c["fits"], bool)
        terms = sum(v for k, v in c["memory_gb"].items() if k != "total")
        assert c["memory_gb"]["total"] == pytest.approx(terms, abs=0.01)
        assert c["fits"] == (c["memory_gb"]["total"] <= 32)
    Plan.model_validate(body)


def test_study_example_table_highlights_the_choice_with_its_reasons():
    result = invoke(*STUDY_EXAMPLE)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "▶ zero3 GC sdpa" in out
    assert "chosen: zero3 + gradient checkpointing + sdpa" in out
    assert "without it, zero3 + sdpa needs" in out  # why checkpointing
    assert "without it, zero2 + gradient checkpointing + sdpa needs" in out  # why ZeRO-3
    assert "flash_attention_2 not considered" in out
    for header in ("params", "grads", "optim", "activ", "overhead", "gpu", "total", "fits", "time", "reason"):
        assert header in out
    chosen = plan_json(*STUDY_EXAMPLE)["chosen"]["memory_gb"]  # the table's gpu column, on its row
    extra = re.compile(rf"\s{chosen['reserve'] + chosen['communicator']:.2f}\s+{chosen['total']:.2f}\s")
    assert any(line.lstrip().startswith("▶") and extra.search(line) for line in out.splitlines()), extra


def test_gpu_type_brings_flash_attention_in():
    body = plan_json(*STUDY_EXAMPLE, "--gpu-type", "A100")
    assert body["chosen"]["attention"] == "flash_attention_2"
    assert body["notes"] == []


@pytest.mark.parametrize("model", [str(TINY), str(TINY / "config.json"), "tiny-llama"])
def test_model_from_a_local_directory_config_file_or_bundled_name(model, eft_home):
    body = plan_json("plan", "--model", model, "--gpu-memory", "1")
    assert body["model"]["parameters"] == 897_408
    # one GPU shards nothing: plain DDP, no DeepSpeed engine
    assert body["chosen"]["strategy"] == "ddp"
    two = plan_json("plan", "--model", model, "--gpu-memory", "2", "--gpus", "2")  # NCCL's buffers: 1 GB
    assert two["chosen"]["strategy"] == "ddp"  # it fits: the simplest wins the tie with ZeRO-1
    tight = plan_json("plan", "--model", "llama-2-7b", "--method", "full", "--gpu-memory", "80", "--gpus", "8")
    assert tight["chosen"]["strategy"] != "ddp"  # 7B full fine-tuning needs its optimizer sharded


def test_lora_flags_and_qlora():
    lora = plan_json("plan", "--model", "llama-2-7b", "--lora-r", "64", "--target-modules",
                     "q_proj,v_proj", "--gpu-memory", "80")
    assert lora["model"]["trainable_parameters"] == 33_554_432
    qlora = plan_json("plan", "--model", "llama-2-7b", "--method", "qlora", "--gpu-memory", "80")
    assert qlora["chosen"]["memory_gb"]["parameters"] < lora["chosen"]["memory_gb"]["parameters"] / 3
    full = plan_json("plan", "--model", "llama-2-7b", "--method", "full", "--gpu-memory", "80")
    assert full["model"]["trainable_parameters"] == full["model"]["parameters"]


def test_nothing_fits_exits_1_with_suggestions():
    body = plan_json("plan", "--model", "falcon-180b", "--gpus", "16", "--gpu-memory", "32",
                     "--seq-len", "16384", "--gpu-type", "V100", exit_code=1)
    assert body["chosen"] is None
    assert body["suggestions"][0]["change"] == "seq_len"
    result = invoke("plan", "--model", "falcon-180b", "--gpus", "16", "--gpu-memory", "32",
                    "--seq-len", "16384", "--gpu-type", "V100")
    assert result.exit_code == 1 and "nothing fits" in result.stdout
    assert "sequences of" in result.stdout


def test_forced_strategy_limits_the_candidates():
    body = plan_json("plan", "--model", "llama-2-7b", "--gpu-memory", "80", "--strategy", "fsdp")
    assert {c["strategy"] for c in body["candidates"]} == {"fsdp"}


@pytest.mark.parametrize(("args", "message"), [
    (("--model", "no-such-model"), "unknown model 'no-such-model'"),
    (("--model", "llama-2-7b", "--target-modules", "query_key_value"), "has no module query_key_value"),
])
def test_usage_errors_exit_2(args, message, eft_home):
    result = invoke("plan", *args, "--gpu-memory", "80")
    assert result.exit_code == 2
    assert message in result.output


def _fake_plan_server(requests: list[httpx.Request]) -> httpx.MockTransport:
    local = cli_plan.plan_locally  # the server would answer what the planner says

    def handle(request: httpx.Request) -> httpx.Response:
        requests.append(request)
        from eft.types.plans import PlanRequest

        body = local(PlanRequest.model_validate(json.loads(request.content)))
        return httpx.Response(200, json=body.model_dump(mode="json"))

    return httpx.MockTransport(handle)


def test_remote_flag_posts_the_request_to_the_service(monkeypatch):
    requests: list[httpx.Request] = []

    def make_client(base_url, api_key) -> Client:
        return Client(base_url="http://eft.test", http_client=httpx.Client(
            transport=_fake_plan_server(requests)), max_retries=0)

    monkeypatch.setattr(output, "make_client", make_client)
    remote = plan_json(*STUDY_EXAMPLE, "--remote")
    assert [(r.method, r.url.path) for r in requests] == [("POST", "/plan")]
    sent = json.loads(requests[0].content)
    assert sent["cluster"] == {"gpus": 8, "gpu_memory_gb": 32.0, "gpu_type": None}
    assert sent["hyperparameters"]["max_seq_len"] == 4096
    assert sent["hyperparameters"]["micro_batch_size"] == 1
    assert sent["method"] == {"type": "lora", "r": 8, "target_modules": "all-linear"}
    assert remote == plan_json(*STUDY_EXAMPLE)


def test_client_plan_sync_and_async():
    requests: list[httpx.Request] = []
    fields = {"model": "llama-2-70b", "hyperparameters": {"max_seq_len": 4096, "micro_batch_size": 1},
              "cluster": {"gpus": 8, "gpu_memory_gb": 32}}
    client = Client(base_url="http://eft.test", http_client=httpx.Client(
        transport=_fake_plan_server(requests)), max_retries=0)
    result = client.plan(**fields)
    assert isinstance(result, Plan) and result.chosen.strategy == "zero3"
    assert json.loads(requests[0].content) == fields  # only what was set is sent

    async def run() -> Plan:
        http = httpx.AsyncClient(transport=_fake_plan_server(requests))
        async with AsyncClient(base_url="http://eft.test", http_client=http, max_retries=0) as a:
            return await a.plan(fields)

    assert asyncio.run(run()).chosen == result.chosen
