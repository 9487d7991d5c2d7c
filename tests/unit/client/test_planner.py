"""The planner against the study it follows ("A Study of Optimizations for Fine-tuning Large Language
Models", Singh et al. 2024; /work/shared/seeds/002): Table 1's theoretical memory, Figure 4's
recommended configurations, and the LoRA/QLoRA, fit and nearest-fit rules.

Run: .venv/bin/python -m pytest tests/unit/client/test_planner.py -q
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from eft.planner import (
    KNOWN_ARCHITECTURES,
    Configuration,
    PlannerError,
    PlanSpec,
    architecture_from_config,
    architecture_from_dict,
    estimate_memory,
    known_architecture,
    nearest_fit,
    plan,
    supports_flash_attention,
    with_parameters,
)
from eft.planner.memory import layer_activation_bytes, loss_bytes
from eft.planner.spec import STRATEGIES, Overheads
from tests.helpers.paths import REPO

TINY = REPO / "assets" / "models" / "tiny-llama"
# Section 5.1; dropout as PEFT's examples of the time set it (the figure's cells were fitted with it).
STUDY_LORA = {"method": "lora", "lora_r": 64, "lora_targets": ("q_proj", "v_proj"), "lora_dropout": 0.05}


def candidate(result, strategy, offload="none", checkpointing=False, attention="sdpa"):
    wanted = Configuration(strategy, offload, checkpointing, attention)
    return next(c for c in result.candidates if c.config == wanted)


# --- Table 1 ---------------------------------------------------------------------------------
# The study's setup for Table 1 (section 4 and 5.1): full fine-tuning of Llama 2 7B with θ taken as
# its nominal 7 billion parameters (the table writes "4 x 7 + (12/8) x 7"), 8 A100 80 GB GPUs,
# mixed-precision Adam, no offload for the theoretical column, s = 256 and one sequence per GPU.
# The study's activations come from s·b·h·(34 + 5·a·s/h) with L = 32: 32 · 256 · 4096 · 44 bytes =
# 1.48 GB. The planner counts what autograd saves in a Llama layer under sdpa instead (no
# attention scores are stored; the SwiGLU MLP keeps 4 tensors of width 11008) plus the loss
# buffers, within 2% of the study's figure, and on top of it what transformers' norms keep in
# 16 bits: each computes in fp32 and keeps that copy of its input (2 x 4h bytes per token and
# layer, 0.27 GB here), which the study's formula (Megatron's, with fused norms) does not have.
# "Theoretical GPU memory" is model states + activations; term C (overhead) is not in it.

TABLE_1 = {  # stage: (model states formula in GB, theoretical total, empirical with offload)
    "zero1": (4 * 7 + 12 / 8 * 7, 39.98, 28.38),
    "zero2": (2 * 7 + 14 / 8 * 7, 27.73, 17.43),
    "zero3": (16 / 8 * 7, 15.48, 4.97),
}
STUDY_ACTIVATIONS_GB = 32 * 256 * 4096 * 44 / 1e9
NORM_COPIES_GB = 32 * 256 * 2 * 4 * 4096 / 1e9


@pytest.fixture(scope="module")
def table_1_plan():
    arch = with_parameters(known_architecture("llama-2-7b"), 7_000_000_000)
    return plan(PlanSpec(arch, method="full", seq_len=256, micro_batch=1, gpus=8,
                         gpu_memory_gb=80, gpu_type="A100"))


@pytest.mark.parametrize("stage", TABLE_1)
def test_table_1_theoretical_memory_per_zero_stage(table_1_plan, stage):
    states, theoretical, _ = TABLE_1[stage]
    memory = candidate(table_1_plan, stage).memory
    assert memory.model_states == pytest.approx(states)
    assert memory.activations - NORM_COPIES_GB == pytest.approx(STUDY_ACTIVATIONS_GB, rel=0.02)
    assert memory.theoretical - NORM_COPIES_GB == pytest.approx(theoretical, abs=0.03)
    assert memory.total > memory.theoretical and memory.overhead > 0


def test_table_1_activations_count_what_a_llama_layer_saves(table_1_plan):
    """Per token and layer, in 16 bits: input, RMSNorm's x·rsqrt and output (twice), q, k, v and
    the attention output (4h), the residual, gate/up/act/product (4i), fp32 statistics, and the
    fp32 copy of each norm's input that transformers' norms compute in."""
    memory = candidate(table_1_plan, "zero3").memory
    h, i, a, layers, tokens, vocab = 4096, 11008, 32, 32, 256, 32000
    layer = (6 * h + 4 * h + 4 * i) * 2 + a * 4 + 2 * 4 + 2 * 4 * h
    # The loss: the logits and their gradient in 16 bits, and the fp32 copy of the one chunk it
    # works on (all 256 tokens: a chunk holds 2^23 / 32000 = 262).
    final_norm, loss = 3 * h * 2, 2 * 2 * vocab + 4 * vocab
    assert memory.activations == pytest.approx((layers * layer + final_norm + loss) * tokens / 1e9)


def test_table_1_terms_split_as_zero_says(table_1_plan):
    z1, z2, z3 = (candidate(table_1_plan, s).memory for s in ("zero1", "zero2", "zero3"))
    assert (z1.parameters, z1.gradients, z1.optimizer) == pytest.approx((14, 14, 10.5))
    assert (z2.parameters, z2.gradients, z2.optimizer) == pytest.approx((14, 1.75, 10.5))
    assert (z3.parameters, z3.gradients, z3.optimizer) == pytest.approx((1.75, 1.75, 10.5))
    # "full fine-tuning of a 7 billion parameter model using conventional data parallelism would
    # require more than 112 (16x7) GB"
    assert candidate(table_1_plan, "ddp").memory.model_states == pytest.approx(112)


@pytest.mark.parametrize("stage", TABLE_1)
def test_table_1_offload_column_is_the_optimizer_term_moved_to_cpu(table_1_plan, stage):
    _, _, empirical = TABLE_1[stage]
    predicted = candidate(table_1_plan, stage, offload="optimizer").memory.theoretical - NORM_COPIES_GB
    # ZeRO-2 and ZeRO-3 land within 0.25 GB of the measured value, ZeRO-1 within 1.1 GB (the
    # study's model, without the norms' fp32 copies; with them ZeRO-3 is 0.27 GB higher).
    assert predicted == pytest.approx(empirical, abs=1.2 if stage == "zero1" else 0.25)


def test_zero3_model_states_scale_with_nodes_as_in_section_5_3():
    # "full fine-tuning of θ = 100B parameter model over M = 5 nodes occupies 40 GB"
    arch = with_parameters(known_architecture("llama-2-70b"), 100_000_000_000)
    memory = estimate_memory(PlanSpec(arch, method="full", gpus=40), Configuration("zero3"))
    assert memory.model_states == pytest.approx(40)


# --- Figure 4 --------------------------------------------------------------------------------
# The study's matrix for 8 V100 32 GB GPUs (16 for Falcon 180B), LoRA r = 64 on q_proj, v_proj
# (Falcon: its fused query_key_value), micro batch 1, no FlashAttention (V100s lack it). The text
# gives every one of the 20 cells. Its labels name the ZeRO stage, LoRA and GC only; the runs used
# ZeRO-Offload of optimizer states by default (section 5.1), so offload is not compared.

FIGURE_4 = {
    "llama-2-7b": ("Z1", "Z1", "Z1", "Z2 GC", "Z3 GC"),
    "llama-2-13b": ("Z1", "Z2 GC", "Z2 GC", "Z2 GC", "Z3 GC"),
    "llama-2-70b": ("Z3", "Z3 GC", "Z3 GC", "Z3 GC", "Z3 GC"),
    "falcon-180b": ("Z3 GC", "Z3 GC", "Z3 GC", "Z3 GC", "NA"),
}
CONTEXT_LENGTHS = (256, 512, 1024, 2048, 4096)
# The one cell the planner answers differently: see the test below.
DEPARTS = {("llama-2-7b", 4096)}


def figure_4_spec(model: str, seq_len: int, attentions: tuple[str, ...] = ("eager",)) -> PlanSpec:
    """The study's runs: fp16 on V100s, eager attention (the attention scores are stored, as its
    5·a·s/h term counts), DeepSpeed's ZeRO stages (the study compares those only)."""
    falcon = model.startswith("falcon")
    lora = {**STUDY_LORA, "lora_targets": ("query_key_value",)} if falcon else STUDY_LORA
    return PlanSpec(known_architecture(model), seq_len=seq_len, micro_batch=1,
                    gpus=16 if falcon else 8, gpu_memory_gb=32, gpu_type="V100", precision="fp16",
                    attentions=attentions, strategies=("zero1", "zero2", "zero3"), **lora)


def figure_4_label(result) -> str:
    if result.chosen is None:
        return "NA"
    config = result.chosen.config
    stage = f"Z{config.strategy[-1]}" if config.strategy.startswith("zero") else config.strategy
    return stage + (" GC" if config.gradient_checkpointing else "")


@pytest.mark.parametrize(("model", "seq_len", "expected"), [
    (model, seq_len, cell)
    for model, row in FIGURE_4.items()
    for seq_len, cell in zip(CONTEXT_LENGTHS, row)
    if (model, seq_len) not in DEPARTS
])
def test_figure_4_cell(model, seq_len, expected):
    result = plan(figure_4_spec(model, seq_len))
    assert figure_4_label(result) == expected, result.chosen and result.chosen.reason
    if result.chosen is not None:
        assert result.chosen.config.attention == "eager"  # the study's kernel: no flash on V100
    else:
        assert result.suggestions, "a cell where nothing fits must say what would"


def test_figure_4_llama_2_7b_at_4096_keeps_zero2_where_the_study_moved_to_zero3():
    """A documented departure. By the study's own formulas ZeRO-2 + LoRA + GC needs about 20 GB for
    7B at 4096 tokens, while the same configuration for 13B at 2048, which the study does recommend,
    needs about 30 GB; no memory model that grows with size and length can reject the first and
    accept the second, so the planner keeps the faster ZeRO-2 here. ZeRO-3 + GC fits as well."""
    result = plan(figure_4_spec("llama-2-7b", 4096))
    assert figure_4_label(result) == "Z2 GC"
    assert candidate(result, "zero3", checkpointing=True, attention="eager").fits
    z2_7b = candidate(result, "zero2", checkpointing=True, attention="eager").memory.total
    z2_13b = candidate(plan(figure_4_spec("llama-2-13b", 2048)), "zero2", checkpointing=True,
                       attention="eager").memory.total
    assert z2_7b < z2_13b <= 32


def test_figure_4_trend_never_lowers_the_stage_along_rows_or_columns():
    stages = {(m, s): figure_4_label(plan(figure_4_spec(m, s))) for m in FIGURE_4 for s in CONTEXT_LENGTHS}
    rank = {"Z1": 1, "Z2 GC": 2, "Z3": 3, "Z3 GC": 3, "NA": 4}
    models = list(FIGURE_4)
    for m in models:
        row = [rank[stages[m, s]] for s in CONTEXT_LENGTHS]
        assert row == sorted(row), m
    for s in CONTEXT_LENGTHS:
        column = [rank[stages[m, s]] for m in models]
        assert column == sorted(column), s


def test_zero2_and_zero1_lora_are_close_as_the_study_found():
    # Section 5.2: with LoRA, "memory usage as well as runtime are approximately similar between
    # ZeRO-1 and ZeRO-2", dominated by the 14 GB of 16-bit base weights.
    result = plan(PlanSpec(known_architecture("llama-2-7b"), seq_len=256, gpus=8,
                           gpu_memory_gb=80, gpu_type="A100", **STUDY_LORA))
    z1, z2 = candidate(result, "zero1"), candidate(result, "zero2")
    assert z1.fits and z2.fits
    assert z2.relative_time / z1.relative_time < 1.05
    assert abs(z1.memory.total - z2.memory.total) < 0.2
    arch = known_architecture("llama-2-7b")
    phi = arch.lora_parameters(64, ("q_proj", "v_proj"))
    assert z1.memory.parameters == pytest.approx(2 * (arch.parameters + phi) / 1e9)  # ~14 GB


# --- LoRA and QLoRA terms --------------------------------------------------------------------


def test_lora_trainable_counts_match_the_study():
    # "roughly 33.6 million for the 7B model"; "about 131 million parameters (~0.19%)" for 70B.
    seven, seventy = known_architecture("llama-2-7b"), known_architecture("llama-2-70b")
    assert seven.lora_parameters(64, ("q_proj", "v_proj")) == pytest.approx(33.6e6, rel=0.01)
    phi = seventy.lora_parameters(64, ("q_proj", "v_proj"))
    assert phi == pytest.approx(131e6, rel=0.01)
    assert phi / seventy.parameters == pytest.approx(0.0019, abs=0.0001)
    assert seven.parameters == pytest.approx(6.74e9, rel=0.001)
    assert seventy.parameters == pytest.approx(68.98e9, rel=0.001)


def test_lora_keeps_frozen_base_weights_in_16_bits_and_16_bytes_per_trainable_parameter():
    arch = known_architecture("llama-2-13b")
    spec = PlanSpec(arch, seq_len=512, gpus=8, **STUDY_LORA)
    theta, phi = arch.parameters, spec.trainable_parameters
    z2 = estimate_memory(spec, Configuration("zero2"))
    assert z2.parameters == pytest.approx((2 * theta + 2 * phi) / 1e9)
    assert z2.gradients == pytest.approx(2 * phi / 8 / 1e9)
    assert z2.optimizer == pytest.approx(12 * phi / 8 / 1e9)
    z3 = estimate_memory(spec, Configuration("zero3"))
    assert z3.parameters == pytest.approx((2 * theta + 2 * phi) / 8 / 1e9)


@pytest.mark.parametrize("double_quant", [True, False])
def test_qlora_stores_linears_in_4_bits_plus_constants(double_quant):
    arch = known_architecture("llama-2-70b")
    spec = PlanSpec(arch, method="qlora", seq_len=512, double_quant=double_quant)
    constants = 1 / 64 + 4 / (64 * 256) if double_quant else 4 / 64
    share = arch.linear_fraction
    # the rest (embeddings, norms) in fp32 as PEFT's k-bit preparation leaves them; fp32 adapters
    expected = ((0.5 + constants) * share + 4 * (1 - share)) * arch.parameters + 4 * spec.trainable_parameters
    memory = estimate_memory(spec, Configuration("ddp"))
    assert memory.parameters == pytest.approx(expected / 1e9)
    assert 0.5 < memory.parameters / (arch.parameters / 1e9) < 0.6  # about half a byte per parameter
    lora = estimate_memory(replace(spec, method="lora"), Configuration("ddp"))
    assert (memory.gradients, memory.optimizer) == (lora.gradients, lora.optimizer)


def test_qlora_fits_70b_on_one_48gb_gpu_where_lora_does_not():
    # The QLoRA paper's claim, without CPU offload: one GPU, plain data parallelism.
    spec = PlanSpec(known_architecture("llama-2-70b"), method="lora", seq_len=1024, gpus=1,
                    gpu_memory_gb=48, gpu_type="A6000", strategies=("ddp",))
    assert plan(spec).chosen is None
    assert [s.value for s in plan(spec).suggestions if s.change == "method"] == ["qlora"]
    qlora = plan(replace(spec, method="qlora"))
    assert qlora.chosen is not None and qlora.chosen.memory.parameters < 40


# --- activations and candidates --------------------------------------------------------------


def test_only_eager_stores_attention_scores_and_checkpointing_keeps_layer_inputs():
    arch = known_architecture("llama-2-7b")
    spec = PlanSpec(arch, seq_len=2048, micro_batch=2)  # LoRA all-linear, bf16
    s, b, h, a, layers, e = 2048, 2, arch.hidden_size, arch.num_heads, arch.num_layers, 2
    sdpa = estimate_memory(spec, Configuration("ddp")).activations
    flash = estimate_memory(spec, Configuration("ddp", attention="flash_attention_2")).activations
    eager = estimate_memory(spec, Configuration("ddp", attention="eager")).activations
    checkpointed = estimate_memory(spec, Configuration("ddp", gradient_checkpointing=True)).activations
    assert sdpa == flash  # neither kernel stores the a·s·s scores
    # eager: an fp32 softmax and its 16-bit copy per score, no log-sum-exp
    assert eager - sdpa == pytest.approx(layers * s * b * a * (s * (4 + e) - 4) / 1e9)
    # one layer recomputed in backward, with the gradients of its MLP's gate and up outputs
    layer = layer_activation_bytes(spec, "sdpa") + 2 * arch.intermediate_size * e * s * b
    kept = layers * h * e * s * b + h * e * s * b  # layer inputs, and the final norm's input
    assert checkpointed == pytest.approx((kept + max(layer, loss_bytes(spec))) / 1e9)


def test_lora_dropout_keeps_a_mask_and_an_output_per_adapted_linear():
    arch = known_architecture("llama-2-7b")
    spec = PlanSpec(arch, seq_len=512, micro_batch=1, lora_dropout=0.05)
    h, i, e, mask = arch.hidden_size, arch.intermediate_size, 2, 1  # bf16 on CUDA: a bool mask
    with_dropout = layer_activation_bytes(spec, "sdpa")
    without = layer_activation_bytes(replace(spec, lora_dropout=0.0), "sdpa")
    # q, k, v and gate, up each keep their own mask and output where without dropout the
    # group keeps its one shared input; o and down likewise
    per_token = (3 * h + h + 2 * h + i) * (mask + e) - (h + h + h + i) * e
    assert with_dropout - without == pytest.approx(per_token * 512)
    cpu = replace(spec, device="cpu", precision="fp32")  # the CPU multiplies by a noise tensor
    per_token_cpu = (3 * h + h + 2 * h + i) * (4 + 4) - (h + h + h + i) * 4
    assert (layer_activation_bytes(cpu, "sdpa") - layer_activation_bytes(replace(cpu, lora_dropout=0.0), "sdpa")
            == pytest.approx(per_token_cpu * 512))


def test_fp32_jobs_hold_four_byte_weights_and_eight_bytes_of_adamw_state():
    arch = known_architecture("llama-2-7b")
    spec = PlanSpec(arch, method="full", seq_len=256, device="cpu", precision="fp32",
                    gradient_accumulation=False)
    memory = estimate_memory(spec, Configuration("ddp"))
    theta = arch.parameters
    assert (memory.parameters, memory.gradients, memory.optimizer) == pytest.approx(
        (4 * theta / 1e9, 4 * theta / 1e9, 8 * theta / 1e9))
    assert memory.overhead == 0  # one CPU worker: no CUDA context, no DDP buckets
    # without accumulation the gradients replace the activations at the peak; the complete
    # gradients coexist with the first layer's activations, the last that backward frees
    layer = layer_activation_bytes(spec, "sdpa") / 1e9
    assert memory.total == pytest.approx(memory.parameters + memory.optimizer
                                         + max(memory.activations, memory.gradients + layer))
    accumulating = estimate_memory(replace(spec, gradient_accumulation=True), Configuration("ddp"))
    assert accumulating.total == pytest.approx(accumulating.theoretical)


def test_offload_moves_optimizer_then_parameters_off_the_gpu():
    spec = PlanSpec(known_architecture("llama-2-7b"), method="full", gpus=8)
    none, opt, both = (estimate_memory(spec, Configuration("zero3", o))
                       for o in ("none", "optimizer", "optimizer+params"))
    assert none.optimizer > 0 and opt.optimizer == 0 and opt.parameters == none.parameters
    assert both.parameters == 0 and both.gradients == none.gradients


def test_every_candidate_fits_exactly_when_its_total_is_within_the_gpu():
    result = plan(replace(figure_4_spec("llama-2-13b", 1024, attentions=("sdpa", "flash_attention_2")),
                          strategies=STRATEGIES))
    assert len(result.candidates) == 20  # 10 strategy/offload pairs x GC x sdpa
    for c in result.candidates:
        assert c.fits == (c.memory.total <= 32)
        prefix = "chosen" if c is result.chosen else "fits" if c.fits else "does not fit"
        assert c.reason.startswith(prefix), c.reason
    fastest = min(c.relative_time for c in result.candidates if c.fits)
    assert result.chosen.relative_time == fastest
    assert result.candidates[0] is result.chosen
    assert any("flash_attention_2 not considered" in n for n in result.notes)


def test_flash_attention_is_a_candidate_on_ampere_and_wins_there():
    result = plan(replace(figure_4_spec("llama-2-70b", 4096, ("sdpa", "flash_attention_2")),
                          gpu_type="A100", gpu_memory_gb=80))
    assert {c.config.attention for c in result.candidates} == {"sdpa", "flash_attention_2"}
    assert result.chosen.config.attention == "flash_attention_2"
    assert not result.notes


def test_forced_strategy_is_the_only_one_weighed():
    result = plan(replace(figure_4_spec("llama-2-7b", 256), strategies=("fsdp",)))
    assert {c.config.strategy for c in result.candidates} == {"fsdp"}
    assert result.chosen.config.strategy == "fsdp"


def test_chosen_configuration_explains_each_optimization_it_enables():
    result = plan(PlanSpec(known_architecture("llama-2-70b"), seq_len=4096, gpus=8, gpu_memory_gb=32))
    assert result.chosen.config == Configuration("zero3", "none", True, "sdpa")
    assert [line.split(" (")[0] for line in result.why] == ["zero3", "gradient checkpointing"]
    assert all("does not fit in 32 GB" in line for line in result.why)


@pytest.mark.parametrize(("gpu", "expected"), [
    ("V100", False), ("Tesla T4", False), ("NVIDIA A100-SXM4-80GB", True), ("H100", True),
    ("l40s", True), (None, None), ("mystery", None),
])
def test_flash_attention_support_by_gpu_type(gpu, expected):
    assert supports_flash_attention(gpu) is expected


# --- nearest fit -----------------------------------------------------------------------------


def test_nearest_fit_when_nothing_fits_falcon_at_4096():
    result = plan(figure_4_spec("falcon-180b", 4096))
    assert result.chosen is None
    assert [s.change for s in result.suggestions] == ["seq_len"]
    shorter = result.suggestions[0].value
    assert 2048 <= shorter < 4096 and shorter % 128 == 0
    again = plan(replace(result.spec, seq_len=shorter)).chosen
    assert (again.config, again.memory) == (result.suggestions[0].chosen.config,
                                            result.suggestions[0].chosen.memory)
    assert "nearest that fits: sequences of" in result.refusal()


def test_nearest_fit_for_a_forced_strategy_names_zero3_and_checkpointing():
    spec = replace(figure_4_spec("llama-2-70b", 4096), strategies=("zero2",))
    result = plan(spec)
    assert result.chosen is None
    first = result.suggestions[0]
    assert (first.change, first.value) == ("strategy", "auto")
    assert first.chosen.config.strategy == "zero3" and first.chosen.config.gradient_checkpointing
    assert "zero3" in result.refusal()


def test_nearest_fit_for_full_fine_tuning_suggests_offload_gpus_lora_and_qlora():
    # Without CPU offload (which would move every model state to the host).
    spec = PlanSpec(known_architecture("llama-2-70b"), method="full", seq_len=2048, micro_batch=4,
                    gpus=8, gpu_memory_gb=80, gpu_type="H100", offloads=("none",))
    suggestions = {s.change: s for s in nearest_fit(spec)}
    assert set(suggestions) >= {"offload", "gpus", "method"}
    gpus = suggestions["gpus"].value
    assert gpus > 8
    assert plan(replace(spec, gpus=gpus)).chosen is not None
    assert plan(replace(spec, gpus=gpus - 1)).chosen is None
    methods = [s.value for s in nearest_fit(spec) if s.change == "method"]
    assert methods == ["lora", "qlora"]
    assert nearest_fit(replace(spec, method="lora")) == ()  # that one fits already


def test_nearest_fit_suggests_a_smaller_micro_batch():
    spec = replace(figure_4_spec("llama-2-70b", 4096), micro_batch=4)
    assert plan(spec).chosen is None
    suggestions = {s.change: s.value for s in plan(spec).suggestions}
    smaller = suggestions["micro_batch"]
    assert 1 <= smaller < 4
    assert plan(replace(spec, micro_batch=smaller)).chosen is not None  # the largest that fits
    assert all(plan(replace(spec, micro_batch=b)).chosen is None for b in range(smaller + 1, 4))


# --- architectures ---------------------------------------------------------------------------


def test_registry_holds_the_study_models_and_more():
    assert {"llama-2-7b", "llama-2-13b", "llama-2-70b", "falcon-180b", "llama-3-8b", "llama-3-70b",
            "mistral-7b"} <= set(KNOWN_ARCHITECTURES)
    assert known_architecture("Llama-3-8B").parameters == pytest.approx(8.03e9, rel=0.001)
    assert known_architecture("mistral-7b").parameters == pytest.approx(7.24e9, rel=0.001)
    assert known_architecture("falcon-180b").parameters == pytest.approx(179e9, rel=0.01)
    assert known_architecture("gpt-5") is None


def _safetensors_elements(path: Path) -> int:
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
    total = 0
    for name, info in header.items():
        if name != "__metadata__":
            count = 1
            for dim in info["shape"]:
                count *= dim
            total += count
    return total


def test_tiny_llama_config_json_loads_and_counts_like_its_weights():
    arch = architecture_from_config(TINY / "config.json")
    assert (arch.hidden_size, arch.num_layers, arch.num_heads, arch.num_kv_heads,
            arch.intermediate_size, arch.vocab_size) == (128, 4, 4, 2, 256, 1197)
    assert arch.name == "tiny-llama" and architecture_from_config(TINY) == arch
    assert arch.parameters == _safetensors_elements(TINY / "model.safetensors")


def test_config_with_falcon_spellings_and_missing_numbers():
    falcon = architecture_from_dict({"model_type": "falcon", "hidden_size": 14848, "num_hidden_layers": 80,
                                     "num_attention_heads": 232, "num_kv_heads": 8,
                                     "new_decoder_architecture": True, "vocab_size": 65024}, "f")
    assert replace(falcon, name="falcon-180b") == known_architecture("falcon-180b")
    with pytest.raises(PlannerError, match="lacks num_hidden_layers") as info:
        architecture_from_dict({"hidden_size": 8, "num_attention_heads": 2, "vocab_size": 10}, "x")
    assert info.value.param == "model"


def test_bad_specs_name_their_field():
    arch = known_architecture("llama-2-7b")
    with pytest.raises(PlannerError) as info:
        PlanSpec(arch, lora_targets=("query_key_value",))
    assert info.value.param == "lora_targets" and "q_proj" in str(info.value)
    with pytest.raises(PlannerError) as info:
        PlanSpec(arch, method="dora")
    assert info.value.param == "method"
    with pytest.raises(PlannerError) as info:
        PlanSpec(arch, gpus=0)
    assert info.value.param == "gpus"
    with pytest.raises(PlannerError):
        Configuration("ddp", offload="optimizer")


def test_the_planner_imports_nothing_heavy():
    code = ("import sys, eft.planner\n"
            "print(','.join(m for m in ('torch', 'ray', 'fastapi', 'transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            timeout=120, cwd=REPO)
    assert result.stdout.strip() == ""


def test_a_gpu_plan_holds_the_allocators_reserve_and_ncclS_buffers():
    """What a GPU adds beyond what the code allocates: the caching allocator's reserve on every
    GPU, NCCL's buffers when there are several; nothing of the kind on the CPU."""
    arch = known_architecture("llama-2-7b")
    one = estimate_memory(PlanSpec(arch, gpus=1, device="cuda", precision="bf16"), Configuration("ddp"))
    two = estimate_memory(PlanSpec(arch, gpus=2, device="cuda", precision="bf16"), Configuration("zero3"))
    cpu = estimate_memory(PlanSpec(arch, gpus=2, device="cpu", precision="fp32"), Configuration("ddp"))
    costs = Overheads()
    assert one.context == pytest.approx(costs.cuda_context_gb)
    churn = one.allocated - one.context - one.parameters - one.optimizer  # what comes and goes each step
    assert one.reserve == pytest.approx(churn * costs.allocator_reserve) and one.reserve > 0
    assert one.communicator == 0.0 and two.communicator == pytest.approx(costs.nccl_gb)
    assert one.total == pytest.approx(one.allocated + one.reserve)
    assert two.total == pytest.approx(two.allocated + two.reserve + costs.nccl_gb)
    assert (cpu.reserve, cpu.communicator, cpu.context) == (0.0, 0.0, 0.0) and cpu.total == cpu.allocated
    assert set(one.as_dict()) >= {"reserve", "communicator", "total"}


def test_the_planner_against_published_gpu_peaks():
    """bench/planner_published.py's rows: at least 80% within 15% of the published peak, each
    compared with the planner's figure of the same kind, and the allocated peaks (the ones the
    planner models term by term) within 10%."""
    from bench.planner_published import RUNS, predict

    ratios = {run: predict(run) / run.measured_gb for run in RUNS}
    assert sum(0.85 <= r <= 1.15 for r in ratios.values()) >= 0.8 * len(RUNS), ratios
    assert all(0.9 <= r <= 1.1 for run, r in ratios.items() if run.measure == "allocated"), ratios
    several = [r for run, r in ratios.items() if run.gpus > 1 and run.strategy == "zero3"]
    assert several and all(0.85 <= r <= 1.15 for r in several), several
