"""Relative step time of a configuration: documented heuristics, not a measurement.

`relative_time(config)` is a product of factors, 1.0 for DDP without offload, without gradient
checkpointing, with sdpa attention, on the same model, method and shapes. The factors only need
to order configurations the way the study's measurements do (section 5):
- ZeRO-1 and ZeRO-2 run about as fast as plain data parallelism with LoRA ("memory usage as well
  as runtime are approximately similar between ZeRO-1 and ZeRO-2"); ZeRO-2 is given 2% more.
  With gradient checkpointing "ZeRO-1 runtime is marginally higher than ZeRO-2" (Figure 2,
  configuration b): ZeRO-1 + GC gets 3% more, which puts it behind ZeRO-2 + GC.
- DDP, which the study did not measure, moves the same bytes as ZeRO-1 (an all-reduce is a
  reduce-scatter plus an all-gather) and gets ZeRO-1's factors; ties go to DDP, the simplest,
  which starts without DeepSpeed's engine (`planning._rank`); ZeRO-1 is chosen where only its
  sharded optimizer state fits.
- ZeRO-3 "comes at the expense of increased runtime" and is "evidently excessive" for models that
  fit without it: 1.35, more than checkpointing costs, so ZeRO-2 + GC beats ZeRO-3 (Figure 4, 13B).
  FSDP full sharding moves the same bytes as ZeRO-3 and gets the same factor.
- Gradient checkpointing adds "20%-30%" (section 3.1): 1.25.
- CPU offload costs time (Figure 2, configuration e: no offload is the fastest): optimizer states
  1.3, optimizer and parameters 2.0 (every parameter crosses PCIe in forward and backward).
- FlashAttention-2 "significantly lowers ... runtime for larger context lengths" (Figure 3): 0.9;
  eager attention, without fused kernels, 1.1.
"""

from __future__ import annotations

from eft.planner.spec import Configuration

STRATEGY_TIME = {"ddp": 1.0, "zero1": 1.0, "zero2": 1.02, "zero3": 1.35, "fsdp": 1.35}
CHECKPOINTING_TIME = 1.25
ZERO1_WITH_CHECKPOINTING_TIME = 1.03
OFFLOAD_TIME = {"none": 1.0, "optimizer": 1.3, "optimizer+params": 2.0}
ATTENTION_TIME = {"sdpa": 1.0, "eager": 1.1, "flash_attention_2": 0.9}


def relative_time(config: Configuration) -> float:
    """Predicted step time of `config` relative to DDP + sdpa without offload or checkpointing."""
    time = STRATEGY_TIME[config.strategy] * OFFLOAD_TIME[config.offload]
    time *= ATTENTION_TIME[config.attention]
    if config.gradient_checkpointing:
        time *= CHECKPOINTING_TIME
        if config.strategy in ("zero1", "ddp"):
            time *= ZERO1_WITH_CHECKPOINTING_TIME
    return time


# GPU families without FlashAttention-2 (it needs compute capability 8.0, Ampere, or newer).
_NO_FLASH = ("v100", "t4", "p100", "p40", "p4", "k80", "m60", "m40", "titan v", "rtx 20", "quadro rtx")
_FLASH = ("a100", "a800", "a10", "a30", "a40", "a16", "a2", "a6000", "a5000", "a4000", "l4", "l40",
          "h100", "h800", "h200", "h20", "gh200", "b100", "b200", "gb200", "rtx 30", "rtx 40",
          "rtx 50", "rtx a")


def supports_flash_attention(gpu_type: str | None) -> bool | None:
    """True or False for a GPU type the planner knows, None when it is not given or unknown."""
    if not gpu_type:
        return None
    name = gpu_type.lower().replace("nvidia", "").replace("tesla", "").replace("-", " ").strip()
    name = name.replace("geforce", "").strip()
    if name.startswith(_NO_FLASH):
        return False
    if name.startswith(_FLASH):
        return True
    return None
