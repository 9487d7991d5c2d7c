"""The engine a base model is listed with, from its config alone (service/serving/support.py);
the model servers' own environment holds the list to vLLM's registry on the whole kit
(tests/serving/test_vllm_conformance.py)."""

from __future__ import annotations

import json

from eft.service.serving.support import serving_engine
from tests.helpers.paths import MODELS


def test_the_kits_chat_families_are_listed_as_served_by_vllm():
    for name in ("tiny-llama", "tiny-qwen3", "tiny-gemma-2", "tiny-phi-3", "tiny-mistral"):
        assert serving_engine(json.loads((MODELS / name / "config.json").read_text())) == "vllm", name


def test_an_architecture_vllm_lacks_or_a_head_its_cpu_kernels_lack_falls_back_to_transformers():
    assert serving_engine({"architectures": ["SomeNewForCausalLM"], "hidden_size": 64,
                           "num_attention_heads": 2}) == "transformers"
    narrow = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_attention_heads": 4}
    assert serving_engine(narrow, cpu=True) == "transformers"  # heads of 16: no CPU kernel
    assert serving_engine(narrow, cpu=False) == "vllm"
    assert serving_engine({"architectures": ["Qwen3ForCausalLM"], "head_dim": 128, "hidden_size": 64,
                           "num_attention_heads": 4}) == "vllm"
