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

from eft.training.config import TrainConfig
from eft.training.model import compute_dtype
from eft.training.strategies.common import no_autocast, trainable_parameters


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

    def step(self, lr: float) -> Any:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.model.step()
        # As DeepSpeed keeps it (a device tensor under ZeRO): the loop reads it at reports only.
        norm = self.model.get_global_grad_norm()
        return norm if norm is not None and self.cfg.max_grad_norm else None

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
        # Every rank holds the full state and writes it; under stage 3 rank 0's copy is then
        # partitioned back to every rank (modifier_rank=0) as the parameters are released.
        with self._gathered(modifier_rank=0), torch.no_grad():
            for name, param in self._named_trainable():
                param.copy_(state[name].to(param.device, param.dtype))

    def optimizer_state(self) -> dict[str, Any]:
        """Adam's moments and the fp32 master weights by parameter name, consolidated from
        every rank's partition (a collective), so the state loads at any world size."""
        from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

        state: dict[str, dict[str, torch.Tensor]] = {}
        for name, param in self._named_trainable():
            entry = {"fp32": safe_get_full_fp32_param(param)}
            for key in ("exp_avg", "exp_avg_sq"):
                value = safe_get_full_optimizer_state(param, key)
                if value is not None:
                    entry[key] = value
            state[name] = {k: v.detach().to("cpu", copy=True) for k, v in entry.items()}
        return {"format": "named-adam", "step": self._optimizer_step(), "state": state}

    def load_optimizer_state(self, state: dict[str, Any]) -> None:
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

        self._ensure_optimizer_state()
        for name, param in self._named_trainable():
            entry = state["state"][name]
            safe_set_full_fp32_param(param, entry["fp32"].to(torch.float32))
            for key in ("exp_avg", "exp_avg_sq"):
                if key in entry:
                    safe_set_full_optimizer_state(param, entry[key].to(torch.float32), key)
        self._set_optimizer_step(int(state["step"]))

    def _partitions(self) -> list[torch.Tensor]:
        """This rank's flat fp32 partitions: the tensors the base AdamW steps."""
        zero = self.optimizer
        flats = getattr(zero, "fp32_partitioned_groups_flat", None)  # stage 3
        return list(flats if flats is not None else zero.single_partition_of_fp32_groups)

    def _base_states(self) -> list[dict[str, Any]]:
        base = self.optimizer.optimizer  # the torch AdamW over DeepSpeed's flat fp32 partitions
        return [base.state[p] for p in self._partitions() if p in base.state]

    def _optimizer_step(self) -> int:
        steps = [int(s["step"]) for s in self._base_states() if "step" in s]
        return max(steps, default=0)

    def _ensure_optimizer_state(self) -> None:
        """Adam creates its state on the first step; create it now (zeros) so a restored
        state has somewhere to go, and let DeepSpeed map it to parameters."""
        base = self.optimizer.optimizer
        for p in self._partitions():
            if not base.state[p]:
                base.state[p]["step"] = torch.zeros((), dtype=torch.float32)
                base.state[p]["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                base.state[p]["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        link = getattr(self.optimizer, "_lazy_init_hp_params_optimizer_state", None)
        if link is not None:  # stages 1 and 2 link parameter fragments to the state lazily
            link()

    def _set_optimizer_step(self, step: int) -> None:
        for s in self._base_states():
            s["step"] = torch.tensor(float(step), dtype=torch.float32)
