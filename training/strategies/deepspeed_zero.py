"""DeepSpeed ZeRO stage 1, 2 or 3, inside the Ray Train worker.

`deepspeed.initialize` reuses the process group Ray Train set up (gloo on CPU, NCCL on GPUs).
Gradient accumulation is left to the training loop (`managed_gradient_accumulation: false`):
backward only accumulates locally, and `step()` reduces across ranks and updates, so ranks may
run different micro-batch splits of the same global batch. `cfg.offload` moves optimizer state
("optimizer", ZeRO-Offload) and, for stage 3, parameters too ("optimizer+params") to CPU.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist

from training.config import TrainConfig
from training.model import compute_dtype
from training.strategies import no_autocast, trainable_parameters


def deepspeed_config(cfg: TrainConfig, stage: int, world_size: int) -> dict[str, Any]:
    """The DeepSpeed config for a job; batch sizes only satisfy DeepSpeed's consistency check
    (the loop owns the global batch)."""
    zero: dict[str, Any] = {"stage": stage}
    if cfg.offload in ("optimizer", "optimizer+params"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cfg.use_gpu}
    if stage == 3 and cfg.offload == "optimizer+params":
        zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.use_gpu}
    return {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": 1,
        "train_batch_size": cfg.micro_batch_size * world_size,
        "managed_gradient_accumulation": False,
        "gradient_clipping": cfg.max_grad_norm or 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": compute_dtype(cfg) == torch.bfloat16},
        "fp16": {"enabled": compute_dtype(cfg) == torch.float16},
        # A torch AdamW with ZeRO-Offload on CPU avoids compiling DeepSpeed's CPU Adam.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }


class ZeroStrategy:
    def __init__(self, cfg: TrainConfig, stage: int):
        self.cfg, self.stage = cfg, stage
        self.name = f"zero{stage}"

    def prepare(self, model: torch.nn.Module) -> None:
        import deepspeed

        params = trainable_parameters(model)
        optimizer = torch.optim.AdamW(params, lr=self.cfg.learning_rate, weight_decay=self.cfg.weight_decay)
        config = deepspeed_config(self.cfg, self.stage, dist.get_world_size() if dist.is_initialized() else 1)
        self.model, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, model_parameters=params, config=config
        )
        self.module = self.model.module

    def accumulate(self, last: bool):  # noqa: ANN201 - reduction happens in step()
        return contextlib.nullcontext()

    def autocast(self):  # noqa: ANN201
        return no_autocast()

    def backward(self, loss: torch.Tensor) -> None:
        self.model.backward(loss, scale_wrt_gas=False)

    def step(self, lr: float) -> float | None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.step()
        norm = self.model.get_global_grad_norm()
        return float(norm) if norm is not None and self.cfg.max_grad_norm else None

    def _named_trainable(self) -> list[tuple[str, torch.nn.Parameter]]:
        return [(n, p) for n, p in self.module.named_parameters() if p.requires_grad]

    def _gathered(self, modifier_rank: int | None):  # noqa: ANN202
        import deepspeed

        if self.stage < 3:
            return contextlib.nullcontext()
        params = [p for _, p in self._named_trainable()]
        return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        with self._gathered(modifier_rank=None):
            return {n: p.detach().to("cpu", copy=True) for n, p in self._named_trainable()}

    def load_trainable_state(self, state: dict[str, torch.Tensor]) -> None:
        # Every rank holds the full state, so every rank writes its own copy.
        with self._gathered(modifier_rank=None), torch.no_grad():
            for name, param in self._named_trainable():
                param.copy_(state[name].to(param.device, param.dtype))

    def optimizer_state(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        # Master (fp32) partitions come from the saved optimizer state, so they agree with
        # the weights loaded above. DeepSpeed indexes the list by data-parallel rank; at the
        # same world size each rank only reads its own entry.
        world = dist.get_world_size() if dist.is_initialized() else 1
        self.optimizer.load_state_dict([state] * world, load_optimizer_states=True,
                                       load_from_fp32_weights=True)
