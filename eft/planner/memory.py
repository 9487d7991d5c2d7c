"""Peak memory per device of one configuration, term by term (the study's section 4), counted as
the training code allocates it.

Units: bytes in the formulas, GB = 10^9 bytes in `MemoryEstimate` (the study's unit).
Notation: θ base parameters, φ trainable parameters, N devices, s sequence length, b micro batch,
h hidden size, a attention heads, d head dimension, kv key/value heads, I the MLP's inner width,
L layers, V vocabulary, e bytes per activation element (4 in fp32, 2 in bf16/fp16).

A. Model states, bytes per parameter as the strategies hold them (`state_bytes`), divided by N
   where the strategy shards that state (ZeRO-1 the optimizer, ZeRO-2 also the gradients, ZeRO-3
   and FSDP also the parameters, DDP nothing; Rajbhandari et al. 2020):
   - DeepSpeed in bf16/fp16 casts the module: 2-byte parameters and gradients, and the optimizer
     keeps fp32 master weights, momentum and variance, 12 bytes (the study's K): 16θ for full
     fine-tuning without sharding, 4θ + 12θ/N under ZeRO-1 (Table 1).
   - DDP and FSDP keep fp32 parameters (autocast and FSDP's mixed-precision policy cast them for
     compute), fp32 gradients and AdamW's fp32 momentum and variance: 4 + 4 + 8 bytes. LoRA
     under DDP in 16 bits loads the frozen base in the compute dtype (2 bytes) and keeps the
     adapters in fp32.
   - fp32 jobs (every CPU job): 4-byte weights and gradients, 8 bytes of AdamW state.
   - QLoRA: the decoder-layer linears (a share f of θ) in 4 bits, 0.5 byte per parameter plus the
     quantization constants (one fp32 absmax per 64 weights, 4/64 byte; with double quantization
     an 8-bit one, 1/64, plus an fp32 per 256 blocks); the rest (embeddings, norms) in fp32, as
     PEFT's k-bit preparation leaves them.
   - CPU offload "optimizer" moves the optimizer term to host memory; "optimizer+params" moves the
     parameters too, and under FSDP the gradients.
B. Activations, counted per operation from what autograd saves in a pre-norm decoder layer
   (`layer_activation_bytes`), per token:
   - full fine-tuning: the layer input; each norm's outputs (RMSNorm keeps x·rsqrt and the
     weighted output, LayerNorm the output); q, k and v ((a + 2·kv)·d; eager repeats k and v to
     a·d) and the attention output (a·d); the residual after attention; the MLP's gate, up, act
     and product (4I; 2I without a gate); fp32 norm statistics; sdpa's and flash-attention's
     log-sum-exp (a fp32 values) or eager's a·s scores (fp32 softmax, plus a 16-bit copy).
   - LoRA: frozen linears and norms save nothing for their weights, so the layer keeps its input,
     the attention tensors, the residual and the MLP's gate, act and up (3I). Every adapted
     linear keeps its dropout's mask and output (2·in; the mask is one byte per element on CUDA,
     e bytes on the CPU, where dropout multiplies by a noise tensor) and its rank-r
     intermediate; with dropout 0 it keeps only its input, shared by linears that read the same
     tensor.
   - 16-bit activations: each RMSNorm also keeps the fp32 copy of its input it computes in (4h);
     under QLoRA the MLP's gate, up and act are fp32 (PEFT's k-bit preparation keeps the norms
     in fp32, and bitsandbytes' 4-bit layers return their input's dtype).
   All L layers are kept; with gradient checkpointing only their inputs (L·h·e) and, during
   backward, one recomputed layer with the gradients of its MLP's gate and up outputs (its
   backward holds them at once). Then the final norm, and the loss: computed in chunks of
   tokens (`loss_chunk_tokens`), which writes the logits' gradient as it goes, so at its peak
   the logits and their gradient in the compute dtype (2·e bytes per token and vocabulary
   entry; the gradient of fp16 logits is fp32) and, with 16-bit logits, one chunk's fp32 copy
   (`Overheads.loss_chunk_bytes`) live; a whole micro-batch's fp32 logits never do. The loss
   buffers and the recomputed layer never live at once: the larger counts.
C. Overhead (`Overheads`): the CUDA context and workspaces (none on CPU); communication buffers
   (DDP's reducer buckets copy the gradients; ZeRO-1/2 reduce and all-gather buckets,
   2·2·min(5e8, φ); ZeRO-3 gathers the largest module plus a 5e7-element prefetch; FSDP unshards a
   whole layer and prefetches the next); autocast's 16-bit copies of fp32 weights under DDP; QLoRA
   dequantizes the largest module to 16 bits.
D. What a GPU adds beyond what the training code allocates (`MemoryEstimate.total` over
   `MemoryEstimate.allocated`): the caching allocator's reserve (its reserved peak over its
   allocated one: blocks rounded up and fragments between them, `Overheads.allocator_reserve` of
   the allocated peak) and, on several GPUs, NCCL's buffers (`Overheads.nccl_gb`), which NCCL
   allocates outside torch's allocator. A job is planned to fit with both, so the planner counts
   what nvidia-smi shows rather than what `max_memory_allocated` reports.

The peak: without gradient accumulation the gradients are created during backward while the
activations are freed (`zero_grad(set_to_none=True)` drops them after each step), so the peak holds
the activations or the gradients, whichever is larger; with accumulation both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from eft.planner.spec import Configuration, PlanSpec

GB = 1e9
HALF_BYTES = 2
ADAM_BYTES = 12  # the study's K: fp32 master weights, momentum and variance
NF4_BYTES = 0.5
ABSMAX_BYTES = 4 / 64
DOUBLE_QUANT_ABSMAX_BYTES = 1 / 64 + 4 / (64 * 256)
FP32 = 4
ELEMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
SHARDED = {  # strategy -> (parameters, gradients, optimizer) sharded across the N devices
    "ddp": (False, False, False),
    "zero1": (False, False, True),
    "zero2": (False, True, True),
    "zero3": (True, True, True),
    "fsdp": (True, True, True),
}


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted peak memory of one device, GB (10^9 bytes), term by term."""

    parameters: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float
    gradients_with_activations: bool = True
    """Whether the gradients live while the forward's activations do (gradient accumulation);
    without it the peak holds the larger of the two."""
    update_temporaries: float = 0.0
    """What lives beside the complete gradients: the first layer's activations or the optimizer
    step's temporaries."""

    @property
    def model_states(self) -> float:
        """Term A: parameters + gradients + optimizer states."""
        return self.parameters + self.gradients + self.optimizer

    @property
    def theoretical(self) -> float:
        """Model states + activations: what the study's Table 1 calls theoretical GPU memory."""
        return self.model_states + self.activations

    context: float = 0.0
    """The CUDA context and workspaces, part of `overhead` (none on the CPU)."""
    reserve: float = 0.0
    """What the caching allocator holds beyond the allocated peak: block rounding and
    fragmentation (none on the CPU, where the process's resident set is the measure)."""
    communicator: float = 0.0
    """NCCL's own buffers on a GPU of several (allocated by NCCL, outside torch's allocator)."""

    @property
    def allocated(self) -> float:
        """The allocator's peak (torch's `max_memory_allocated`) plus the CUDA context: states,
        overhead, and the larger of the backward's two high points."""
        forward = self.activations + (self.gradients if self.gradients_with_activations else 0.0)
        update = self.gradients + self.update_temporaries
        return self.parameters + self.optimizer + self.overhead + max(forward, update)

    @property
    def total(self) -> float:
        """What the device must hold (what nvidia-smi shows at the peak): the allocated peak, the
        allocator's reserve beyond it and NCCL's buffers. The planner fits on this."""
        return self.allocated + self.reserve + self.communicator

    def largest_term(self) -> tuple[str, float]:
        terms = {"parameters": self.parameters, "gradients": self.gradients,
                 "optimizer": self.optimizer, "activations": self.activations,
                 "overhead": self.overhead}
        name = max(terms, key=terms.__getitem__)
        return name, terms[name]

    def as_dict(self, digits: int = 3) -> dict[str, float]:
        terms = ("parameters", "gradients", "optimizer", "activations", "overhead", "reserve", "communicator", "total")
        return {term: round(getattr(self, term), digits) for term in terms}


def element_bytes(spec: PlanSpec) -> int:
    """e: bytes of one activation element in the job's compute precision."""
    return ELEMENT_BYTES[spec.precision]


def state_bytes(spec: PlanSpec, config: Configuration) -> tuple[float, float, float, float]:
    """Bytes per parameter as the strategy holds them: (frozen or fully trained base weight,
    adapter weight, gradient, optimizer state), before sharding."""
    if spec.precision == "fp32":
        return FP32, FP32, FP32, 8
    if config.strategy.startswith("zero"):  # DeepSpeed casts the module to 16 bits
        return HALF_BYTES, HALF_BYTES, HALF_BYTES, ADAM_BYTES
    base = HALF_BYTES if (spec.method == "lora" and config.strategy == "ddp") else FP32
    return base, FP32, FP32, 8


def parameter_bytes_per_base_param(spec: PlanSpec, config: Configuration) -> float:
    """Bytes per base parameter as stored: 2 or 4 by strategy and precision, less under QLoRA."""
    base = state_bytes(spec, config)[0]
    if spec.method != "qlora":
        return base
    quantized = NF4_BYTES + (DOUBLE_QUANT_ABSMAX_BYTES if spec.double_quant else ABSMAX_BYTES)
    share = spec.architecture.linear_fraction
    return quantized * share + FP32 * (1 - share)


def model_state_bytes(spec: PlanSpec, config: Configuration) -> tuple[float, float, float]:
    """(parameters, gradients, optimizer) bytes on one device: term A."""
    theta, phi, n = spec.architecture.parameters, spec.trainable_parameters, spec.gpus
    shard_p, shard_g, shard_o = (n if sharded else 1 for sharded in SHARDED[config.strategy])
    _, adapter, grad, optim = state_bytes(spec, config)
    parameters = parameter_bytes_per_base_param(spec, config) * theta
    if spec.method != "full":
        parameters += adapter * phi
    gradients = grad * phi / shard_g
    optimizer = optim * phi / shard_o
    if config.offload != "none":
        optimizer = 0.0
    if config.offload == "optimizer+params":
        parameters = 0.0
        if config.strategy == "fsdp":
            gradients = 0.0
    return parameters / shard_p, gradients, optimizer


def _groups(spec: PlanSpec) -> tuple[tuple, tuple, tuple, tuple]:
    """A layer's linears as (attention inputs, attention output, MLP inputs, MLP output): the
    last linear of each kind projects back to the residual stream, the others read the norm."""
    linears = spec.architecture.layer_linears()
    attention = tuple(m for m in linears if m.kind != "mlp")
    mlp = tuple(m for m in linears if m.kind == "mlp")
    return attention[:-1], attention[-1:], mlp[:-1], mlp[-1:]


def _adapter_bytes(group: tuple, adapted: set[str], spec: PlanSpec, mask: float) -> float:
    """Per token: what the LoRA adapters on one group of linears sharing an input keep."""
    e, p = element_bytes(spec), spec.lora_dropout
    mine = [m for m in group if m.name in adapted]
    if not mine:
        return 0.0
    rank = len(mine) * spec.lora_r * e  # lora_A's output, kept by lora_B
    if p > 0:  # each adapter's own dropout: its mask and its output, kept by lora_A
        return rank + sum(m.in_features * (mask + e) for m in mine)
    return rank + mine[0].in_features * e  # the shared input, kept by lora_A


def layer_activation_bytes(spec: PlanSpec, attention: str) -> float:
    """Bytes one decoder layer keeps for backward, for s·b tokens (term B, per layer)."""
    arch, e = spec.architecture, element_bytes(spec)
    h, heads, kv, d, inner = (arch.hidden_size, arch.num_heads, arch.num_kv_heads,
                              arch.resolved_head_dim, arch.intermediate_size)
    mask = 1 if spec.device == "cuda" else e  # dropout's saved mask: bool on CUDA, noise on CPU
    per_token = 0.0
    # attention core: q, k, v (eager repeats k and v per head) and the output
    qkv = (3 * heads * d) if attention == "eager" else (heads + 2 * kv) * d
    per_token += (qkv + heads * d) * e
    if attention == "eager":  # the fp32 softmax, and its copy in the compute dtype
        per_token += heads * spec.seq_len * (FP32 + (e if e != FP32 else 0))
    else:  # log-sum-exp
        per_token += heads * FP32
    stats = 2 * (2 if arch.layer_norm else 1) * FP32  # the two norms' fp32 statistics
    per_token += stats
    if e < FP32 and not arch.layer_norm:
        # transformers' RMSNorms compute in fp32: with 16-bit activations each keeps an fp32 copy
        # of its input (measured in bf16, with and without autocast: bench/activations.py)
        per_token += 2 * FP32 * h
    if spec.method == "full":
        norm = (1 if arch.layer_norm else 2) * h  # RMSNorm keeps x·rsqrt and the weighted output
        mlp = (4 if arch.gated_mlp else 2) * inner
        per_token += (h + norm + h + norm + mlp) * e  # input, norm 1, residual, norm 2, MLP
    else:
        adapted = {m.name for m in arch.adapted_linears(spec.lora_targets)}
        attn_in, attn_out, mlp_in, mlp_out = _groups(spec)
        mlp = (3 if arch.gated_mlp else 1) * inner  # gate, act, up (act input without a gate)
        # QLoRA: PEFT's k-bit preparation keeps the norms in fp32, so the MLP's 4-bit layers get
        # (and return, as bitsandbytes does) fp32 activations
        mlp_bytes = FP32 if spec.method == "qlora" else e
        per_token += (h + h) * e + mlp * mlp_bytes  # input, residual, MLP
        for group in (attn_in, attn_out, mlp_in, mlp_out):
            per_token += _adapter_bytes(group, adapted, spec, mask)
    return per_token * spec.seq_len * spec.micro_batch


#: fp32 values (chunk tokens x vocabulary) the training loss works on at a time on the CPU
#: (`training.steps.token_cross_entropy_sum`): 8M, about 100 MB of temporaries.
LOSS_CHUNK_ELEMENTS = 1 << 23
#: On an accelerator at most this many chunks per micro-batch (`training.steps.LOSS_DEVICE_CHUNKS`).
LOSS_DEVICE_CHUNKS = 4


def loss_chunk_tokens(vocab_size: int, tokens: int = 0, device: str = "cpu") -> int:
    """Tokens per chunk of the training loss: on the CPU 65 for Llama 3's 128k vocabulary, at
    least 64; on an accelerator also at least a `LOSS_DEVICE_CHUNKS`-th of the micro-batch."""
    chunk = max(64, LOSS_CHUNK_ELEMENTS // max(1, vocab_size))
    if device != "cpu":
        chunk = max(chunk, -(-tokens // LOSS_DEVICE_CHUNKS))
    return chunk


def loss_bytes(spec: PlanSpec) -> float:
    """The loss's buffers at their peak, in its forward: the logits and their gradient in the
    compute dtype, and with 16-bit logits one chunk's fp32 copy. Counted for every token of the
    micro-batch: the loss asks for the logits of the positions that predict a target only
    (`training.steps.token_loss_sum`), and a dataset may train every token."""
    tokens, vocab, e = spec.seq_len * spec.micro_batch, spec.architecture.vocab_size, element_bytes(spec)
    overheads = spec.overheads
    chunk_tokens = min(tokens, loss_chunk_tokens(vocab, tokens, spec.device))
    chunk = overheads.loss_chunk_bytes * chunk_tokens * vocab if e < 4 else 0.0
    grad = 4 if spec.precision == "fp16" else e  # fp16 logits get an fp32 gradient (fp16's range is short)
    return (e + grad) * tokens * vocab + chunk


def forward_bytes(spec: PlanSpec, config: Configuration) -> float:
    """What the forward keeps for backward, the loss aside: every layer's saved tensors (with
    checkpointing only the layer inputs) and the final norm's."""
    arch, e = spec.architecture, element_bytes(spec)
    tokens = spec.seq_len * spec.micro_batch
    final_norm = (1 if spec.method != "full" else (2 if arch.layer_norm else 3)) * arch.hidden_size * e
    if config.gradient_checkpointing:
        return (arch.num_layers * arch.hidden_size * e + final_norm) * tokens
    return arch.num_layers * layer_activation_bytes(spec, config.attention) + final_norm * tokens


def recomputed_bytes(spec: PlanSpec, config: Configuration) -> float:
    """With checkpointing, the peak of one layer's backward: its recomputed activations and the
    gradients of the MLP's inner tensors (gate and up, [tokens, intermediate] each), which its
    backward holds at once. Without checkpointing, nothing beyond the forward's."""
    if not config.gradient_checkpointing:
        return 0.0
    arch = spec.architecture
    inner_grads = (2 if arch.gated_mlp else 1) * arch.intermediate_size * element_bytes(spec)
    return layer_activation_bytes(spec, config.attention) + inner_grads * spec.seq_len * spec.micro_batch


def activation_bytes(spec: PlanSpec, config: Configuration) -> float:
    """Term B: what the forward keeps, plus the larger of the loss buffers and (with
    checkpointing) the backward of the one layer recomputed: the two never live at once."""
    return forward_bytes(spec, config) + max(recomputed_bytes(spec, config), loss_bytes(spec))


def context_bytes(spec: PlanSpec) -> float:
    """The CUDA context and workspaces; nothing of the kind on CPU."""
    return spec.overheads.cuda_context_gb * GB if spec.device == "cuda" else 0.0


def communication_bytes(spec: PlanSpec, config: Configuration) -> float:
    """Buffers the data-parallel strategy allocates: none on one device."""
    arch, costs, phi = spec.architecture, spec.overheads, spec.trainable_parameters
    if spec.gpus == 1 and config.strategy == "ddp":
        return 0.0  # one worker: Ray Train does not wrap the model in DDP
    stored = parameter_bytes_per_base_param(spec, config)
    if config.strategy == "ddp":
        return state_bytes(spec, config)[2] * phi  # the reducer's buckets, one gradient copy
    if config.strategy in ("zero1", "zero2"):
        return 2 * HALF_BYTES * min(costs.zero_bucket_elements, phi)
    if config.strategy == "zero3":
        return stored * (arch.largest_module_parameters + costs.zero3_prefetch_elements)
    return 2 * stored * arch.layer_parameters  # fsdp: the layer in use and the next, unsharded


def overhead_bytes(spec: PlanSpec, config: Configuration) -> float:
    """Term C: context, communication buffers, autocast's weight copies, QLoRA dequantization."""
    arch = spec.architecture
    total = context_bytes(spec) + communication_bytes(spec, config)
    if config.strategy == "ddp" and spec.precision != "fp32":
        # autocast's 16-bit copies of the fp32 weights the forward reads, kept for backward
        copied = arch.parameters if spec.method == "full" else spec.trainable_parameters
        total += HALF_BYTES * copied
    if spec.method == "qlora":
        total += HALF_BYTES * arch.largest_module_parameters
    if spec.reference_copy:  # DPO's frozen reference model, whole on every device
        total += (FP32 if spec.precision == "fp32" else HALF_BYTES) * arch.parameters
    return total


def update_temporary_bytes(spec: PlanSpec, config: Configuration) -> float:
    """What lives beside the complete gradients: the first layer's activations, the last that
    backward frees, or afterwards the optimizer step's temporaries (torch's foreach AdamW on CUDA
    holds an fp32 list the size of the trainable parameters; the CPU's per-tensor loop one tensor
    at a time), whichever is larger."""
    layer = layer_activation_bytes(spec, config.attention)
    if spec.device != "cuda" or config.strategy.startswith("zero") or config.offload != "none":
        return layer
    shard = spec.gpus if config.strategy == "fsdp" else 1
    return max(layer, FP32 * spec.trainable_parameters / shard)


def estimate_memory(spec: PlanSpec, config: Configuration) -> MemoryEstimate:
    """Predicted peak memory per device of `config` for `spec`, in GB, with every term separate."""
    parameters, gradients, optimizer = model_state_bytes(spec, config)
    estimate = MemoryEstimate(
        parameters=parameters / GB, gradients=gradients / GB, optimizer=optimizer / GB,
        activations=activation_bytes(spec, config) / GB, overhead=overhead_bytes(spec, config) / GB,
        gradients_with_activations=spec.gradient_accumulation,
        update_temporaries=update_temporary_bytes(spec, config) / GB,
        context=context_bytes(spec) / GB,
    )
    if spec.device != "cuda":
        return estimate
    costs = spec.overheads
    # Parameters and optimizer states are allocated once, in blocks the allocator fills; what
    # comes and goes every step (activations, gradients, buffers, temporaries) is what it rounds
    # up and fragments.
    churn = estimate.allocated - estimate.context - estimate.parameters - estimate.optimizer
    return replace(estimate, reserve=churn * costs.allocator_reserve,
                   communicator=costs.nccl_gb if spec.gpus > 1 else 0.0)
