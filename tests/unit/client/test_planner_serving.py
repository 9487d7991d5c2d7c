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


def test_a_replica_on_part_of_a_gpu_gives_vllm_that_part_and_is_refused_what_does_not_fit_it():
    from eft.planner.serving import server_memory, share_utilization

    assert share_utilization(1.0, 0.85) == 0.85 and share_utilization(2.0, 0.85) == 0.85
    assert share_utilization(0.5, 0.85) == pytest.approx(0.425)  # two such replicas: 85% of the GPU, not 170%
    arch = known_architecture("llama-3-8b")
    half = server_memory(arch, gpu=True, device_gb=80, gpu_share=0.5, gpu_memory_utilization=0.85)
    whole = server_memory(arch, gpu=True, device_gb=80, gpu_share=1.0, gpu_memory_utilization=0.85)
    assert half.total == pytest.approx(0.425 * 80 * GIB) and whole.total == pytest.approx(0.85 * 80 * GIB)
    assert half.weights == whole.weights and half.kv_tokens < whole.kv_tokens / 2  # the weights stay: less KV
    with pytest.raises(PlannerError) as refused:  # 15 GiB of weights do not fit 0.2 x 0.85 of 80 GiB
        server_memory(arch, gpu=True, device_gb=80, gpu_share=0.2)
    assert refused.value.param == "EFT_INFERENCE_GPUS" and "0.2 of a GPU" in str(refused.value)


def test_a_cpu_replicas_reserved_memory_is_split_between_the_base_models_it_holds():
    from eft.planner.serving import server_memory

    arch = architecture_from_config(TINY_LLAMA)
    alone = server_memory(arch, gpu=False, kv_cache_gb=1.0)
    assert server_memory(arch, gpu=False, kv_cache_gb=1.0, host_memory_gb=None) == alone  # no reservation: no check
    fits = server_memory(arch, gpu=False, kv_cache_gb=1.0, host_memory_gb=2 * alone.total / 1e9 + 0.01, base_models=2)
    assert fits == alone
    with pytest.raises(PlannerError) as refused:  # the same reservation split three ways
        server_memory(arch, gpu=False, kv_cache_gb=1.0, host_memory_gb=2 * alone.total / 1e9 + 0.01, base_models=3)
    assert refused.value.param == "EFT_INFERENCE_MEMORY_GB"
    assert "EFT_INFERENCE_KV_CACHE_GB" in str(refused.value) and "KV cache 1.00 GiB" in str(refused.value)


def test_a_plan_shows_the_model_server_of_the_result_on_the_planned_gpu():
    from eft.planner import PlanSpec, plan
    from eft.types.plans import Plan

    arch = known_architecture("llama-3-8b")
    on_h100 = Plan.model_validate(plan(PlanSpec(architecture=arch, gpus=1, gpu_memory_gb=80)).to_dict()).serving
    direct = serving_memory(arch, gpu=True, device_gb=80e9 / GIB, gpu_memory_utilization=0.85)
    assert on_h100.fits and on_h100.memory_gb.total == pytest.approx(direct.total / 1e9, abs=1e-3)
    assert on_h100.kv_tokens == direct.kv_tokens and on_h100.gpu_memory_utilization == 0.85
    on_t4 = plan(PlanSpec(architecture=known_architecture("llama-3-70b"), method="qlora", gpus=8,
                          gpu_memory_gb=16)).to_dict()["serving"]
    assert not on_t4["fits"] and "does not fit a model server" in on_t4["reason"]


def test_the_replica_reserves_its_memory_through_ray_and_its_gpu_share():
    from eft.api.serve_config import model_server

    assert "memory" not in model_server({})["ray_actor_options"]  # the laptop default: no reservation
    options = model_server({"EFT_INFERENCE_GPUS": "0.5", "EFT_INFERENCE_MEMORY_GB": "12"})["ray_actor_options"]
    assert options["num_gpus"] == 0.5 and options["memory"] == 12 * 10**9
