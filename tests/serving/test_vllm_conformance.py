"""The model servers' vLLM engine answers as transformers + PEFT does, on the conformance kit's chat
families: greedy completions of a fixed prompt set, from the base model and from two adapters of it
in one batch (one of them given as a job's checkpoint, which the engine writes out as a PEFT
directory), equal up to the first end-of-sequence on at least 95% of the prompts, per model; and
every chat family's template renders in the model servers' environment as in training's. The two
adapters fill the engine's two adapter slots, so base-model rows share their batches with a full
set of slots (where vLLM's CPU ops, unpatched, gave them the last slot's adapter).

An engine costs ~15 s to start on two cores (two processes that import vLLM), so the greedy
comparison runs on one family per kind of model config (architecture, rope scaling, attention
variant); the families left out share their model with one compared (tiny-llama-3.2 and
tiny-smollm2 are Llama 3.1's and Llama's configurations, tiny-mistral-v0.1 Mistral's, tiny-phi-4
Phi-3's) and differ in their template and tokenizer, which the rendering check covers.

vLLM runs in its own environment (tests/serving/vllm_greedy.py under .venv-serve); transformers +
PEFT here, in the service's. The families vLLM does not serve are listed with the reason, and the
ones it must serve are named, so that a family falling back to transformers' engine fails.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.helpers.adapters import as_checkpoint, random_adapter
from tests.helpers.paths import MODELS, REPO, SERVE_PYTHON

MAX_TOKENS = 12
QUESTIONS = ["hello there", "What is the first word of: frog fox high king", "Count to five.",
             "Name a colour.", "Say something about the sea", "Why is the sky blue?"]
#: The kit's chat families, and whether vLLM's greedy replies are compared on each (see above).
CHAT_FAMILIES = {
    "tiny-llama": True, "tiny-llama-3.1": True, "tiny-llama-3.2": False, "tiny-smollm2": False,
    "tiny-mistral": True, "tiny-mistral-v0.1": False, "tiny-qwen2.5": True, "tiny-qwen3": True,
    "tiny-phi-3": True, "tiny-phi-4": False, "tiny-gemma-2": True, "tiny-gemma-3": True,
}
GREEDY = [name for name, compared in CHAT_FAMILIES.items() if compared]


def _messages(family: str) -> list[list[dict]]:
    return [[{"role": "user", "content": q}] for q in QUESTIONS]


def _greedy(base: str, adapter_dir, prompts: list[list[int]]) -> list[list[int]]:
    """transformers + PEFT's greedy completions, stopping where the model servers' engine stops
    (service/serving/engine.py: the model's end-of-sequence and end-of-turn tokens)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from eft.training.chat import stop_token_ids

    stop_ids = stop_token_ids(AutoTokenizer.from_pretrained(base), GenerationConfig.from_pretrained(base))
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    outputs = []
    with torch.inference_mode():
        for ids in prompts:
            out = model.generate(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 max_new_tokens=MAX_TOKENS, do_sample=False, eos_token_id=stop_ids,
                                 pad_token_id=stop_ids[0], temperature=None, top_p=None, top_k=None)
            outputs.append(out[0, len(ids):].tolist())
    return outputs


def _to_first_stop(tokens: list[int], stops: set[int]) -> list[int]:
    for i, token in enumerate(tokens):
        if token in stops:
            return tokens[:i + 1]
    return tokens


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """vLLM's completions (and renderings) of the chat families, and transformers + PEFT's
    completions of the same prompts, computed here while the model servers' environment runs."""
    from transformers import AutoTokenizer

    from eft.service.serving.engine import Request, prompt_ids

    assert SERVE_PYTHON.exists(), "the model servers' environment is missing: make setup builds .venv-serve"
    root = tmp_path_factory.mktemp("vllm-conformance")
    families, local = [], {}
    for seed, name in enumerate(CHAT_FAMILIES):
        path = str(MODELS / name)
        tokenizer = AutoTokenizer.from_pretrained(path)
        messages = _messages(name)
        prompts = [prompt_ids(tokenizer, Request(messages=m)) for m in messages]
        local[name] = {"path": path, "prompts": prompts, "adapters": {}}
        adapters = []
        if CHAT_FAMILIES[name]:
            first, second = root / name / "adapter-1", root / name / "adapter-2"
            random_adapter(path, first, 2 * seed + 1)
            random_adapter(path, second, 2 * seed + 2)
            as_checkpoint(second, root / name / "checkpoint")
            local[name]["adapters"] = {"ft:one": first, "ft:two:ckpt-1": second}
            adapters = [{"model": "ft:one", "location": str(first), "kind": "artifact"},
                        {"model": "ft:two:ckpt-1", "location": str(root / name / "checkpoint"), "kind": "checkpoint"}]
        families.append({"name": name, "path": path, "messages": messages, "prompts": prompts, "adapters": adapters})
    source, target = root / "in.json", root / "out.json"
    support = [{"name": d.name, "path": str(d)} for d in sorted(MODELS.iterdir()) if (d / "config.json").is_file()]
    source.write_text(json.dumps({"max_tokens": MAX_TOKENS, "cache_dir": str(root / "cache"), "families": families,
                                  "support": support, "too_small": {"path": str(MODELS / "tiny-llama"),
                                                                    "host_memory_gb": 1.0}}))
    log = open(root / "vllm.log", "w")
    run = subprocess.Popen([str(SERVE_PYTHON), str(REPO / "tests" / "serving" / "vllm_greedy.py"), str(source),
                            str(target)], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                           env={"PATH": "/usr/bin:/bin", "HOME": str(root), "OMP_NUM_THREADS": "2",
                                "PYTHONPATH": str(REPO)})
    try:
        expected = {}
        for name in GREEDY:  # transformers + PEFT, while vLLM starts its engines
            spec = local[name]
            expected[name] = {model: _greedy(spec["path"], adapter, spec["prompts"])
                              for model, adapter in [("", None), *spec["adapters"].items()]}
        returncode = run.wait(timeout=900)
    finally:
        run.kill()
    output = (root / "vllm.log").read_text()
    print("\n".join(line for line in output.splitlines() if line.startswith("tiny-")))
    assert returncode == 0, output[-4000:]
    return json.loads(target.read_text()), local, expected


def test_the_service_lists_each_kit_model_with_the_engine_that_serves_it(served):
    """service/serving/support.py decides from config.json alone what the model servers' vLLM
    decides from its registry: the listing's `engine` is the truth on every model of the kit."""
    from eft.service.serving.support import serving_engine

    results = served[0]
    support = results["_support"]
    print("\nnot served by vLLM:", {name: why for name, why in support.items() if why} or "none")
    for name, why in support.items():
        listed = serving_engine(json.loads((MODELS / name / "config.json").read_text()))
        assert listed == ("transformers" if why else "vllm"), (name, why)


def test_every_chat_family_is_served_by_vllm_with_its_template_rendered_as_in_training(served):
    results, local, _ = served
    results = {name: r for name, r in results.items() if not name.startswith("_")}
    unsupported = {name: r["unsupported"] for name, r in results.items() if "unsupported" in r}
    print("\nnot served by vLLM:", unsupported or "none")
    assert unsupported == {}
    for name, result in results.items():  # the model servers' transformers renders the chats as training's
        assert result["rendered"] == local[name]["prompts"], name


def test_a_base_model_larger_than_the_replica_holds_is_refused_before_vllm_starts(served):
    """1 GB reserved for two base models: tiny-llama's engine alone wants its 1 GiB KV cache
    (EFT_INFERENCE_KV_CACHE_GB) beside its weights, so it is refused with what to change."""
    refused = served[0]["_too_small"]
    assert refused is not None, "the engine started in less memory than it takes"
    assert refused["status"] == 409 and refused["code"] == "model_server_too_small", refused
    assert "EFT_INFERENCE_MEMORY_GB" in refused["message"] and "KV cache 1.00 GiB" in refused["message"]


@pytest.mark.parametrize("family", GREEDY)
def test_greedy_replies_equal_transformers_and_peft_up_to_the_first_end(served, family):
    results, local, expected = served
    result = results[family]
    stops = set(result["stop_ids"])
    rates = {}
    for model, want in expected[family].items():
        got = result["outputs"][model]
        equal = [_to_first_stop(e, stops) == _to_first_stop(g, stops) for e, g in zip(want, got)]
        rates[model or "base"] = sum(equal) / len(equal)
        if model:  # the adapter changes the answers: the comparison is not the base model's twice
            assert got != result["outputs"][""], (family, model)
    print(f"\n{family}: greedy replies equal to transformers + PEFT: {rates}")
    assert len(rates) == 3 and all(rate >= 0.95 for rate in rates.values()), rates


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-s"]))
