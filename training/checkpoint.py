"""Checkpoints: everything needed to continue a run exactly, in one directory.

Layout (written by rank 0; trainable state is small for LoRA, so it is saved consolidated and
loads at any world size):
    trainable.safetensors   trainable parameters by name
    optimizer.pt            optimizer and LR scheduler state
    rng.pt                  Python, NumPy and torch RNG states
    trainer_state.json      global step, samples seen, metrics at save time
    adapter/                (final checkpoint only) a PEFT adapter directory with the tokenizer

Ray Train copies the directory into the run's storage and registers it only once the copy is
complete, so a crash mid-save never leaves half a checkpoint behind.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from training.model import load_trainable_state, trainable_state

STATE_FILE = "trainer_state.json"


def save(
    directory: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    step: int,
    metrics: dict[str, float],
) -> None:
    """Write a resumable checkpoint of `model` (unwrapped) into `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file(trainable_state(model), str(directory / "trainable.safetensors"))
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
        directory / "optimizer.pt",
    )
    torch.save(
        {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        directory / "rng.pt",
    )
    (directory / STATE_FILE).write_text(json.dumps({"step": step, "metrics": metrics}))


def restore(
    directory: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
) -> int:
    """Load a checkpoint written by `save` into the given objects. Returns the global step."""
    load_trainable_state(model, load_file(str(directory / "trainable.safetensors")))
    states = torch.load(directory / "optimizer.pt", weights_only=False)
    optimizer.load_state_dict(states["optimizer"])
    scheduler.load_state_dict(states["scheduler"])
    rng = torch.load(directory / "rng.pt", weights_only=False)
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])
    return int(json.loads((directory / STATE_FILE).read_text())["step"])


def read_state(directory: Path) -> dict[str, Any]:
    return json.loads((directory / STATE_FILE).read_text())
