"""Peak memory per GPU of one configuration, as three separate terms (the study's section 4).

Units: bytes in the formulas, GB = 10^9 bytes in `MemoryEstimate` (the study's unit).
Notation: θ base parameters, φ trainable parameters, N GPUs, s sequence length, b micro batch,
h hidden size, a attention heads, L layers, V vocabulary.

A. Model states (mixed precision with Adam, after ZeRO, Rajbhandari et al. 2020):
   parameters = P·θ / n_p, gradients = 2·φ / n_g, optimizer = 12·φ / n_o   (K = 12: fp32 master
   weights, momentum and variance), where n_p, n_g, n_o are N when the strategy shards that state
   and 1 otherwise: ZeRO-1 shards the optimizer, ZeRO-2 also the gradients, ZeRO-3 and FSDP also
   the parameters, DDP nothing. Full fine-tuning has φ = θ and P = 2, so the states add up to 16θ
   without sharding; ZeRO-1 gives 4θ + 12θ/N, ZeRO-2 2θ + 14θ/N, ZeRO-3 16θ/N (Table 1).
   - LoRA: the frozen base weights stay in 16 bits and get neither gradients nor optimizer
     states: parameters = (2θ + 2φ)/n_p, and only the adapters' φ carry 2φ + 12φ (16 bytes each).
   - QLoRA: the decoder-layer linears (a share f of θ) are stored in 4 bits, 0.5 byte per
     parameter plus the quantization constants (one fp32 absmax per 64 weights, 4/64 byte; with
     double quantization an 8-bit one, 1/64, plus an fp32 per 256 blocks), the rest (embeddings,
     norms) in 16 bits: parameters = ((0.5 + q)·f·θ + 2·(1 - f)·θ + 2φ)/n_p.
   - CPU offload "optimizer" (ZeRO-Offload) moves the optimizer term to host memory; with
     "optimizer+params" (ZeRO-Infinity, FSDP CPUOffload) the parameters go too, and FSDP also
     moves the gradients. What is gathered on the GPU while computing is counted in overhead.
B. Activations (Korthikanti et al. 2022, eq. 1, the study's formula), per layer:
   s·b·h·(34 + 5·a·s/h) bytes; all L layers are kept. flash_attention_2 never materialises the
   a·s·s attention scores, so its layer is s·b·h·34 (the quadratic 5·a·s/h part is gone). With
   gradient checkpointing every layer keeps only its 16-bit input, 2·s·b·h, and one layer is
   recomputed in full during backward: L·2·s·b·h + one layer. sdpa and eager are counted alike (an
   upper bound: sdpa's memory-efficient kernel can do better on some GPUs).
C. Overhead (`Overheads`): CUDA context and workspaces; the loss's fp32 logits and their gradient,
   8·s·b·V; communication buffers (DDP's reducer buckets copy the gradients, 2φ; ZeRO-1/2 reduce and
   all-gather buckets, 2·2·min(5e8, φ); ZeRO-3 gathers the largest module plus a 5e7-element
   prefetch; FSDP unshards a whole layer and prefetches the next); QLoRA dequantizes the largest
   module to 16 bits.
"""

from __future__ import annotations

from dataclasses import dataclass

from eft.planner.spec import Configuration, PlanSpec

GB = 1e9
HALF_BYTES = 2
ADAM_BYTES = 12  # the study's K
NF4_BYTES = 0.5
ABSMAX_BYTES = 4 / 64
DOUBLE_QUANT_ABSMAX_BYTES = 1 / 64 + 4 / (64 * 256)
SHARDED = {  # strategy -> (parameters, gradients, optimizer) sharded across the N GPUs
    "ddp": (False, False, False),
    "zero1": (False, False, True),
    "zero2": (False, True, True),
    "zero3": (True, True, True),
    "fsdp": (True, True, True),
}


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak memory of one GPU, GB (10^9 bytes), term by term."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float

    @property
    def model_states(self) -> float:
        """Term A: parameters + gradients + optimizer states."""
        return self.parameters + self.gradients + self.optimizer

    @property
    def theoretical(self) -> float:
        """Model states + activations: what the study's Table 1 calls theoretical GPU memory."""
        return self.model_states + self.activations

    @property
    def total(self) -> float:
        return self.theoretical + self.overhead

    def largest_term(self) -> tuple[str, float]:
        terms = {"parameters": self.parameters, "gradients": self.gradients,
                 "optimizer": self.optimizer, "activations": self.activations,
                 "overhead": self.overhead}
        name = max(terms, key=terms.__getitem__)
        return name, terms[name]

    def as_dict(self, digits: int = 3) -> dict[str, float]:
        terms = ("parameters", "gradients", "optimizer", "activations", "overhead", "total")
        return {term: round(getattr(self, term), digits) for term in terms}


def parameter_bytes_per_base_param(spec: PlanSpec) -> float:
    """Bytes per base parameter as stored on the GPU: 2 in 16 bits, less under QLoRA."""
    if spec.method != "qlora":
        return HALF_BYTES
    quantized = NF4_BYTES + (DOUBLE_QUANT_ABSMAX_BYTES if spec.double_quant else ABSMAX_BYTES)
    share = spec.architecture.linear_fraction
    return quantized * share + HALF_BYTES * (1 - share)


def model_state_bytes(spec: PlanSpec, config: Configuration) -> tuple[float, float, float]:
    """(parameters, gradients, optimizer) bytes on one GPU: term A."""
    theta, phi, n = spec.architecture.parameters, spec.trainable_parameters, spec.gpus
    shard_p, shard_g, shard_o = (n if sharded else 1 for sharded in SHARDED[config.strategy])
    if spec.method == "full":
        parameters = HALF_BYTES * theta
    else:  # frozen base weights plus the adapters' own 16-bit copy
        parameters = parameter_bytes_per_base_param(spec) * theta + HALF_BYTES * phi
    gradients = HALF_BYTES * phi / shard_g
    optimizer = ADAM_BYTES * phi / shard_o
    if config.offload != "none":
        optimizer = 0.0
    if config.offload == "optimizer+params":
        parameters = 0.0
        if config.strategy == "fsdp":
            gradients = 0.0
    return parameters / shard_p, gradients, optimizer


def layer_activation_bytes(spec: PlanSpec, attention: str) -> float:
    """Activations of one transformer layer, s·b·h·(34 + 5·a·s/h) bytes (no 5·a·s/h with flash)."""
    arch, s, b = spec.architecture, spec.seq_len, spec.micro_batch
    quadratic = 0.0 if attention == "flash_attention_2" else 5 * arch.num_heads * s / arch.hidden_size
    return s * b * arch.hidden_size * (34 + quadratic)


def activation_bytes(spec: PlanSpec, config: Configuration) -> float:
    """Term B: L layers, or with checkpointing L 16-bit layer inputs plus one recomputed layer."""
    arch = spec.architecture
    layer = layer_activation_bytes(spec, config.attention)
    if not config.gradient_checkpointing:
        return arch.num_layers * layer
    return arch.num_layers * HALF_BYTES * spec.seq_len * spec.micro_batch * arch.hidden_size + layer


def overhead_bytes(spec: PlanSpec, config: Configuration) -> float:
    """Term C: context, loss buffers, communication buffers, QLoRA dequantization."""
    arch, costs, phi = spec.architecture, spec.overheads, spec.trainable_parameters
    stored = parameter_bytes_per_base_param(spec)
    total = costs.cuda_context_gb * GB
    total += costs.logits_bytes * spec.seq_len * spec.micro_batch * arch.vocab_size
    if config.strategy == "ddp":
        total += HALF_BYTES * phi
    elif config.strategy in ("zero1", "zero2"):
        total += 2 * HALF_BYTES * min(costs.zero_bucket_elements, phi)
    elif config.strategy == "zero3":
        total += stored * (arch.largest_module_parameters + costs.zero3_prefetch_elements)
    else:  # fsdp: the layer in use and the prefetched next one, unsharded
        total += 2 * stored * arch.layer_parameters
    if spec.method == "qlora":
        total += HALF_BYTES * arch.largest_module_parameters
    return total


def estimate_memory(spec: PlanSpec, config: Configuration) -> MemoryEstimate:
    """Predicted peak memory per GPU of `config` for `spec`, in GB, with every term separate."""
    parameters, gradients, optimizer = model_state_bytes(spec, config)
    return MemoryEstimate(
        parameters=parameters / GB, gradients=gradients / GB, optimizer=optimizer / GB,
        activations=activation_bytes(spec, config) / GB, overhead=overhead_bytes(spec, config) / GB,
    )
