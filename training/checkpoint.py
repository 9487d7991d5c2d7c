"""Checkpoints: everything needed to continue a run exactly, at any world size.

Rank 0 writes the files into a temporary directory and reports it with `ray.train.report`;
Ray Train persists it and registers it only once all of it is in storage, so a crash mid-save
never leaves half a checkpoint behind, and it keeps the newest `checkpoint.keep`. Layout:
    trainable.safetensors     the full trainable parameters by name: small for LoRA, and
                              loadable at any world size and under any strategy
    optimizer.pt              the optimizer state, consolidated over ranks (full tensors by
                              parameter name), so a resized job reloads it at its new size
    trainer_state.json        global step, world size, why it was saved, metrics at save time,
                              and the evaluations' state (best validation loss and step)
    best.safetensors          (publish "best") the best evaluation's trainable weights
    adapter/                  (LoRA) the adapter's config, which a model server loads the
                              trainable weights into; the final checkpoint's is the whole PEFT
                              adapter directory + tokenizer

Nothing else is needed: the sample order is a function of (seed, step) (training/data.py) and
the random state (dropout) is reseeded from (seed, step, rank) at every step, so the step is
the whole position of the run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

STATE_FILE = "trainer_state.json"
TRAINABLE_FILE = "trainable.safetensors"
OPTIMIZER_FILE = "optimizer.pt"
#: With publish "best": the trainable weights of the evaluation with the lowest validation loss.
BEST_FILE = "best.safetensors"


ALIASES = "eft_aliases"


def split_shared(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tied weights (an LM head sharing the embedding, as in Qwen 2.5, Llama 3.2, Gemma,
    SmolLM2 and GPT-2) appear under two names backed by one storage; safetensors stores a
    tensor once, so the second name is kept as an alias of the first."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    owners: dict[tuple[int, int, tuple[int, ...]], str] = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if tensor.numel() and key in owners:
            aliases[name] = owners[key]
        else:
            owners[key] = name
            kept[name] = tensor
    return kept, aliases


def save_tensors(state: dict[str, torch.Tensor], path: Path) -> None:
    """Tensors by name in one safetensors file, tied ones stored once (see `load_trainable`)."""
    kept, aliases = split_shared(state)
    save_file({k: v.contiguous() for k, v in kept.items()}, str(path), metadata={ALIASES: json.dumps(aliases)})


def load_trainable(directory: Path, name: str = TRAINABLE_FILE) -> dict[str, torch.Tensor]:
    """The trainable state `save` wrote (or another file `save_tensors` wrote), tied names
    included."""
    path = str(directory / name)
    state = load_file(path)
    with safe_open(path, "pt") as handle:
        aliases = json.loads((handle.metadata() or {}).get(ALIASES, "{}"))
    for alias, owner in aliases.items():
        state[alias] = state[owner]
    return state


def save(
    directory: Path, strategy: Any, rank: int, step: int, world_size: int, reason: str,
    metrics: dict[str, float],
) -> dict[str, torch.Tensor]:
    """Write a checkpoint of the run at `step` (rank 0 writes; every rank must call, since
    gathering the state is a collective). Returns the full trainable state."""
    started = time.perf_counter()
    trainable = strategy.trainable_state()
    optimizer = strategy.optimizer_state()
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        save_tensors(trainable, directory / TRAINABLE_FILE)
        torch.save(optimizer, directory / OPTIMIZER_FILE)
        (directory / STATE_FILE).write_text(json.dumps({
            "step": step, "world_size": world_size, "reason": reason,
            "save_seconds": time.perf_counter() - started, "metrics": metrics,
        }))
    return trainable


def restore(directory: Path, strategy: Any) -> dict[str, Any]:
    """Load a checkpoint written by `save` into `strategy`, whatever the world size it was
    written at. Returns its trainer state (with "step")."""
    strategy.load_trainable_state(load_trainable(directory))
    # weights_only: tensors and plain containers only. A checkpoint lives on shared storage; a
    # file planted there must not run code in the job when it is read back.
    strategy.load_optimizer_state(torch.load(directory / OPTIMIZER_FILE, weights_only=True))
    return read_state(directory)


def read_state(directory: Path) -> dict[str, Any]:
    return json.loads((directory / STATE_FILE).read_text())
