"""A model server's memory: what one vLLM engine of a base model holds (service/serving/vllm_engine.py),
term by term, so that a model server can be placed beside training with its real footprint.

- weights: the base model once, in the serving dtype (bf16 on a GPU, fp32 on a CPU);
- LoRA slots: vLLM allocates `adapters_per_batch` slots of `max_lora_rank` on every adapted
  linear up front (adapters beyond them wait in host memory);
- activations: one scheduled step of `max_batched_tokens` tokens (the widest MLP activation and
  the attention projections) and the sampled rows' fp32 logits;
- KV cache: on a CPU node what the operator gives it (EFT_INFERENCE_KV_CACHE_GB); on a GPU vLLM
  takes `gpu_memory_utilization` of the device and gives the KV cache what the other terms leave,
  so the server's footprint is that share of the GPU whatever the model;
- context: the CUDA context and cuBLAS workspaces on a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from eft.planner.architectures import Architecture, PlannerError

GIB = 2**30
CUDA_CONTEXT_BYTES = 0.5 * GIB


@dataclass(frozen=True)
class ServingMemory:
    weights: float
    lora_slots: float
    activations: float
    kv_cache: float
    context: float
    kv_bytes_per_token: float

    @property
    def total(self) -> float:
        return self.weights + self.lora_slots + self.activations + self.kv_cache + self.context

    @property
    def kv_tokens(self) -> int:
        """Tokens the KV cache holds: what admission counts requests against."""
        return int(self.kv_cache // self.kv_bytes_per_token)


def kv_bytes_per_token(arch: Architecture, dtype_bytes: int) -> float:
    """Keys and values of every layer for one token."""
    return 2.0 * arch.num_layers * arch.num_kv_heads * arch.resolved_head_dim * dtype_bytes


def serving_memory(arch: Architecture, gpu: bool, *, adapters_per_batch: int = 4, max_lora_rank: int = 64,
                   lora_targets: str | tuple[str, ...] = "all-linear", kv_cache_gb: float = 1.0,
                   device_gb: float | None = None, gpu_memory_utilization: float = 0.85,
                   max_batched_tokens: int = 2048, max_sequences: int = 256) -> ServingMemory:
    """The memory of a model server's engine for `arch` (see the module docstring). On a GPU,
    `device_gb` sizes the KV cache; PlannerError when the share of the device leaves it none."""
    dtype = 2 if gpu else 4
    weights = arch.parameters * dtype
    lora_slots = arch.lora_parameters(max_lora_rank, lora_targets) * adapters_per_batch * dtype
    widest = max(arch.intermediate_size * (2 if arch.gated_mlp else 1),
                 (arch.num_heads + 2 * arch.num_kv_heads) * arch.resolved_head_dim)
    activations = max_batched_tokens * (widest + 2 * arch.hidden_size) * dtype + max_sequences * arch.vocab_size * 4
    context = CUDA_CONTEXT_BYTES if gpu else 0.0
    per_token = kv_bytes_per_token(arch, dtype)
    if not gpu:
        kv = kv_cache_gb * GIB
    else:
        if device_gb is None:
            raise PlannerError("a GPU model server's KV cache is what its share of the device leaves: give device_gb",
                               "device_gb")
        kv = gpu_memory_utilization * device_gb * GIB - weights - lora_slots - activations - context
        if kv < per_token * max_batched_tokens:
            raise PlannerError(
                f"{arch.name} does not fit a model server on {gpu_memory_utilization:.0%} of a {device_gb:g} GB GPU: "
                f"weights {weights / GIB:.1f} GiB, LoRA slots {lora_slots / GIB:.2f} GiB and a step's activations "
                f"{activations / GIB:.2f} GiB leave no KV cache; give it a larger share or a larger GPU",
                "gpu_memory_utilization")
    return ServingMemory(weights=weights, lora_slots=lora_slots, activations=activations, kv_cache=kv,
                         context=context, kv_bytes_per_token=per_token)
