"""Training data: tokenize JSONL records with loss masks, and a deterministic sample order.

The order is a stream of per-epoch permutations of the dataset; optimizer step k takes stream
positions [k*G, (k+1)*G) for global batch size G and splits them over the workers. It depends
only on (seed, step), never on the number of workers, so a job resumed at any world size sees
exactly the samples it would have seen, and no example is skipped or repeated within an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from eft.training.formats import check_record, iter_jsonl

IGNORE_INDEX = -100


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    labels: list[int]

    @property
    def loss_tokens(self) -> int:
        # Labels are shifted by one inside the loss: position 0 is never a target.
        return sum(1 for t in self.labels[1:] if t != IGNORE_INDEX)


class DataError(Exception):
    """A record that cannot be trained on; names the file, line and field."""

    def __init__(self, path: str, line: int, field: str, message: str):
        self.path, self.line, self.field = path, line, field
        super().__init__(f"{Path(path).name} line {line}: {field}: {message}")


def _tokenize_chat(tokenizer: Any, messages: list[dict[str, str]]) -> tuple[list[int], list[int]]:
    out = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids = list(out["input_ids"])
    mask = list(out["assistant_masks"])
    labels = [t if m else IGNORE_INDEX for t, m in zip(ids, mask)]
    return ids, labels


def _tokenize_pair(tokenizer: Any, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
    completion_ids = completion_ids + [tokenizer.eos_token_id]
    ids = prompt_ids + completion_ids
    return ids, [IGNORE_INDEX] * len(prompt_ids) + completion_ids


def _tokenize_text(tokenizer: Any, text: str) -> tuple[list[int], list[int]]:
    ids = tokenizer(text, add_special_tokens=True)["input_ids"] + [tokenizer.eos_token_id]
    return ids, list(ids)


def tokenize_record(tokenizer: Any, record: dict[str, Any], max_seq_len: int) -> Example:
    """Tokenize one record of any supported shape, truncated to `max_seq_len` tokens."""
    if "messages" in record:
        ids, labels = _tokenize_chat(tokenizer, record["messages"])
    elif "prompt" in record:
        ids, labels = _tokenize_pair(tokenizer, record["prompt"], record["completion"])
    elif "label" in record:
        ids, labels = _tokenize_pair(tokenizer, record["text"], str(record["label"]))
    else:
        ids, labels = _tokenize_text(tokenizer, record["text"])
    return Example(ids[:max_seq_len], labels[:max_seq_len])


def load_examples(path: str, tokenizer: Any, max_seq_len: int) -> list[Example]:
    """Read, check and tokenize every record of a JSONL file.

    Returns the examples in file order. Raises DataError on the first bad record.
    """
    examples = []
    for lineno, record, parse_error in iter_jsonl(Path(path)):
        if parse_error:
            raise DataError(path, lineno, "line", parse_error)
        _, problems = check_record(record)
        if problems:
            raise DataError(path, lineno, *problems[0])
        example = tokenize_record(tokenizer, record, max_seq_len)
        if example.loss_tokens == 0:
            raise DataError(
                path, lineno, "record",
                f"has no trainable tokens within max_seq_len={max_seq_len}: raise max_seq_len "
                "or shorten the prompt",
            )
        examples.append(example)
    if not examples:
        raise DataError(path, 0, "file", "has no records")
    return examples


def epoch_permutation(num_examples: int, seed: int, epoch: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64([seed, epoch]))
    return rng.permutation(num_examples)


def global_batch_indices(num_examples: int, seed: int, step: int, global_batch_size: int) -> list[int]:
    """Dataset indices of optimizer step `step` (0-based), in stream order."""
    start, stop = step * global_batch_size, (step + 1) * global_batch_size
    out: list[int] = []
    pos = start
    while pos < stop:
        epoch, offset = divmod(pos, num_examples)
        perm = epoch_permutation(num_examples, seed, epoch)
        take = min(stop - pos, num_examples - offset)
        out.extend(int(i) for i in perm[offset : offset + take])
        pos += take
    return out


def shard_for_rank(indices: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's contiguous share of a global batch (sizes differ by at most one)."""
    return [int(i) for i in np.array_split(np.asarray(indices, dtype=np.int64), world_size)[rank]]


def collate(examples: list[Example], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch: input_ids, attention_mask and labels as [batch, seq] tensors."""
    length = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), length), pad_token_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE_INDEX, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), length), dtype=torch.long)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[row, :n] = torch.tensor(e.input_ids)
        labels[row, :n] = torch.tensor(e.labels)
        attention_mask[row, :n] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
