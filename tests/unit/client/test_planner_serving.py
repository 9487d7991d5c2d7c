"""A model server's memory (eft/planner/serving.py): the terms of one vLLM engine, checked against
the figures vLLM's own arithmetic gives for well-known models."""

from __future__ import annotations

import pytest

from eft.planner.architectures import PlannerError, architecture_from_config, known_architecture
from eft.planner.serving import GIB, kv_bytes_per_token, serving_memory
from tests.helpers.paths import TINY_LLAMA


def test_llama_3_8b_on_an_80_gb_gpu_takes_its_share_and_keeps_the_rest_for_kv():
    arch = known_architecture("llama-3-8b")
    # 32 layers x 8 KV heads x 128 x (K and V) x bf16: the 128 KiB per token vLLM's logs show.
    assert kv_bytes_per_token(arch, 2) == 128 * 1024
    memory = serving_memory(arch, gpu=True, device_gb=80, gpu_memory_utilization=0.85)
    assert memory.total == pytest.approx(0.85 * 80 * GIB)
    assert 14.5 * GIB < memory.weights < 15.5 * GIB  # 8.0B parameters in bf16
    # Four slots of rank 64 on every linear layer, allocated up front: 168M parameters each in bf16.
    assert memory.lora_slots == arch.lora_parameters(64, "all-linear") * 4 * 2
    assert 1 * GIB < memory.lora_slots < 1.5 * GIB and memory.activations < 1 * GIB
    assert 350_000 < memory.kv_tokens < 450_000


def test_a_model_too_large_for_its_share_of_the_gpu_is_refused_with_the_terms():
    with pytest.raises(PlannerError) as refused:
        serving_memory(known_architecture("llama-3-70b"), gpu=True, device_gb=80)
    assert "weights" in str(refused.value) and refused.value.param == "gpu_memory_utilization"
    with pytest.raises(PlannerError):
        serving_memory(known_architecture("llama-3-8b"), gpu=True)  # the device's size is needed


def test_a_cpu_server_holds_the_kv_cache_it_is_given_in_fp32():
    arch = architecture_from_config(TINY_LLAMA)
    memory = serving_memory(arch, gpu=False, kv_cache_gb=1.0, adapters_per_batch=2, max_lora_rank=8)
    assert memory.kv_cache == GIB and memory.context == 0
    assert memory.weights == arch.parameters * 4
    assert memory.kv_tokens == GIB // kv_bytes_per_token(arch, 4)
    wider = serving_memory(arch, gpu=False, adapters_per_batch=4, max_lora_rank=8)
    assert wider.lora_slots == pytest.approx(2 * memory.lora_slots)
