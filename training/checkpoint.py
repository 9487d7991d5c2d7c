"""Checkpoints: everything needed to continue a run exactly, in one directory.

Every rank writes its own files into its own temporary directory and reports it; Ray Train
merges the per-rank directories into one and registers the checkpoint only once all of it has
been persisted, so a crash mid-save never leaves half a checkpoint behind. Layout:
    trainable.safetensors     (rank 0) the full trainable parameters by name: small for LoRA,
                              and loadable at any world size and under any strategy
    trainer_state.json        (rank 0) global step and the metrics at save time
    optimizer-rank{r}.pt      each rank's optimizer state (a shard under FSDP / ZeRO)
    rng-rank{r}.pt            each rank's Python, NumPy and torch RNG states
    adapter/                  (final checkpoint, rank 0) a PEFT adapter directory + tokenizer
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

STATE_FILE = "trainer_state.json"
TRAINABLE_FILE = "trainable.safetensors"


def _rank_file(stem: str, rank: int) -> str:
    return f"{stem}-rank{rank}.pt"


def save(directory: Path, strategy: Any, rank: int, step: int, metrics: dict[str, float]) -> dict[str, torch.Tensor]:
    """Write this rank's part of a checkpoint. A collective (gathers the trainable state):
    call on every rank. Returns the full trainable state."""
    directory.mkdir(parents=True, exist_ok=True)
    trainable = strategy.trainable_state()
    torch.save(strategy.optimizer_state(), directory / _rank_file("optimizer", rank))
    torch.save(
        {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()},
        directory / _rank_file("rng", rank),
    )
    if rank == 0:
        save_file({k: v.contiguous() for k, v in trainable.items()}, str(directory / TRAINABLE_FILE))
        (directory / STATE_FILE).write_text(json.dumps({"step": step, "metrics": metrics}))
    return trainable


def _own_file(directory: Path, stem: str, rank: int) -> Path | None:
    own = directory / _rank_file(stem, rank)
    return own if own.exists() else None


def restore(directory: Path, strategy: Any, rank: int) -> int:
    """Load a checkpoint written by `save` into `strategy`. Returns the global step.

    Raises FileNotFoundError when a sharded strategy finds no optimizer shard for this rank
    (the checkpoint was written at another world size)."""
    strategy.load_trainable_state(load_file(str(directory / TRAINABLE_FILE)))
    optimizer_file = _own_file(directory, "optimizer", rank)
    if optimizer_file is None and strategy.name == "ddp":
        optimizer_file = directory / _rank_file("optimizer", 0)  # identical on every DDP rank
    if optimizer_file is None:
        raise FileNotFoundError(f"no optimizer shard for rank {rank} in {directory}")
    strategy.load_optimizer_state(torch.load(optimizer_file, weights_only=False))
    rng_file = _own_file(directory, "rng", rank)
    if rng_file is not None:
        rng = torch.load(rng_file, weights_only=False)
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
    return int(read_state(directory)["step"])


def read_state(directory: Path) -> dict[str, Any]:
    return json.loads((directory / STATE_FILE).read_text())
