"""What the strategies share: the parameters they optimize, and the forward context of those
whose wrapper casts by itself."""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Any

import torch


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def no_autocast() -> AbstractContextManager[Any]:
    """For strategies whose wrapper casts by itself (FSDP's policy, DeepSpeed's modes)."""
    return contextlib.nullcontext()
