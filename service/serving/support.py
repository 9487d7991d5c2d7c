"""Which engine the model servers answer a base model with, told from its config.json alone (the
service's side has no vLLM to ask): vLLM for the architectures it serves with LoRA (vLLM 0.32's
registry; tests/serving/test_vllm_conformance.py holds this list to the model servers' own
environment on the conformance kit), with heads of a size its CPU attention computes where the
model servers run on CPUs; transformers' `generate` for the rest (service/serving/engines.py)."""

from __future__ import annotations

from typing import Any

#: Text-generation architectures vLLM serves with LoRA adapters (a subset of vLLM 0.32's
#: `ModelRegistry` whose classes support LoRA: the families fine-tuned here). Not in it: GPT-2,
#: Bloom and StarCoder2 (no LoRA in vLLM), Gemma 3's multimodal model (its image code needs
#: torchvision, which the CPU environment leaves out).
VLLM_LORA_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM", "Qwen2ForCausalLM", "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM", "GemmaForCausalLM",
    "Phi3ForCausalLM", "GPTNeoXForCausalLM", "OPTForCausalLM", "Olmo2ForCausalLM", "OlmoForCausalLM",
    "GraniteForCausalLM",
})
#: Head sizes vLLM's CPU attention computes (vllm/v1/attention/backends/cpu_attn.py).
VLLM_CPU_HEAD_SIZES = frozenset({32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512})


def head_size(config: dict[str, Any]) -> int | None:
    text = config.get("text_config") or config
    heads = text.get("num_attention_heads") or text.get("n_head")
    hidden = text.get("hidden_size") or text.get("n_embd")
    return text.get("head_dim") or (hidden // heads if heads and hidden else None)


def serving_engine(config: dict[str, Any], cpu: bool = True) -> str:
    """"vllm" or "transformers": the engine a model server answers with for the model whose
    config.json is `config`, on CPU nodes (`cpu`) or GPU ones."""
    if not set(config.get("architectures") or []) & VLLM_LORA_ARCHITECTURES:
        return "transformers"
    if cpu and head_size(config) not in VLLM_CPU_HEAD_SIZES:
        return "transformers"
    return "vllm"
