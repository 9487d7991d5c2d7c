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

Placed beside training: a model server replica holds `EFT_INFERENCE_GPUS` of a GPU and, where
the operator sets it, `EFT_INFERENCE_MEMORY_GB` of its node's memory, both reserved through Ray,
so that the scheduler's slots (service/scheduling/capacity.py: a GPU is a training slot only while
none of it is held) and Ray's placement never give the same memory twice. `server_memory` is what
a replica's engine is checked against before it starts: on a fraction of a GPU vLLM takes that
fraction of the device at most (`share_utilization`), never the default share of the whole
device that another replica or a training worker holds; on a CPU node the replica's memory is
split between the base models it may hold. A base model that does not fit is refused with the
terms and the setting to change, instead of the engine running its node out of memory.
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


def share_utilization(gpu_share: float, gpu_memory_utilization: float) -> float:
    """The share of the device a replica holding `gpu_share` GPUs may give vLLM: its
    `gpu_memory_utilization` of a whole device or more, that fraction of its share otherwise
    (two replicas on halves of a GPU each take 0.85 x 0.5 of it, not 0.85 each)."""
    return gpu_memory_utilization if gpu_share >= 1 else gpu_memory_utilization * gpu_share


def server_memory(arch: Architecture, *, gpu: bool, device_gb: float | None = None, gpu_share: float = 1.0,
                  host_memory_gb: float | None = None, base_models: int = 1, **engine: float | int | str) -> ServingMemory:
    """The memory one engine of a model server replica takes for `arch`, checked against what the
    replica holds: on a GPU `gpu_share` GPUs of `device_gb` GB (PlannerError naming
    EFT_INFERENCE_GPUS when the share leaves no KV cache); on a CPU node, when the replica reserves
    `host_memory_gb`, that memory split between the `base_models` it may hold (PlannerError naming
    EFT_INFERENCE_MEMORY_GB when one does not fit). `engine` are serving_memory's sizes."""
    if gpu:
        utilization = share_utilization(gpu_share, float(engine.pop("gpu_memory_utilization", 0.85)))
        try:
            return serving_memory(arch, True, device_gb=device_gb, gpu_memory_utilization=utilization, **engine)
        except PlannerError as exc:
            if gpu_share >= 1:
                raise
            raise PlannerError(f"{exc} (a model server replica holds {gpu_share:g} of a GPU: raise "
                               "EFT_INFERENCE_GPUS)", "EFT_INFERENCE_GPUS") from None
    engine.pop("gpu_memory_utilization", None)
    memory = serving_memory(arch, False, **engine)
    if host_memory_gb is not None:
        each = host_memory_gb * 1e9 / max(1, base_models)
        if memory.total > each:
            raise PlannerError(
                f"{arch.name} does not fit a model server's memory: weights {memory.weights / GIB:.2f} GiB, LoRA slots "
                f"{memory.lora_slots / GIB:.2f} GiB, a step's activations {memory.activations / GIB:.2f} GiB and the "
                f"KV cache {memory.kv_cache / GIB:.2f} GiB take {memory.total / 1e9:.2f} GB, and a replica's "
                f"{host_memory_gb:g} GB hold {base_models} base model(s) of at most {each / 1e9:.2f} GB: raise "
                "EFT_INFERENCE_MEMORY_GB, or lower EFT_INFERENCE_KV_CACHE_GB or EFT_INFERENCE_BASE_MODELS_PER_REPLICA",
                "EFT_INFERENCE_MEMORY_GB")
    return memory
