"""Training data: tokenize records with loss masks, and a deterministic sample order.

The order is a stream of per-epoch permutations of the dataset; optimizer step k takes stream
positions [k*G, (k+1)*G) for global batch size G and splits them over the workers. It depends
only on (seed, step), never on the number of workers, so a job resumed at any world size sees
exactly the samples it would have seen, and no example is skipped or repeated within an epoch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

if TYPE_CHECKING:  # imported where tensors are made: the API's process never needs torch
    import torch

from eft.training.chat import TemplateError, tokenize_chat
from eft.training.formats import INPUT, NON_PREFERRED, PREFERRED, check_record, iter_records

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

    def __init__(self, path: str, line: int, field: str, message: str, code: str = "invalid_data"):
        self.path, self.line, self.field, self.code = path, line, field, code
        super().__init__(f"{Path(path).name} line {line}: {field}: {message}")


@dataclass(frozen=True)
class TokenizeOptions:
    """How records become token ids and labels (all of it is part of the cache key)."""

    max_seq_len: int = 512
    #: Chat records: "assistant" (every assistant turn), "last_assistant", or "all" tokens.
    train_on: str = "assistant"
    #: Chat records: "keep" the system message, or "fold" it into the first user turn.
    system_message: str = "keep"
    #: Canonical field -> the column it is read from, as sorted pairs (e.g. (("prompt", "q"),)).
    columns: tuple[tuple[str, str], ...] = ()
    #: "sft": records become Examples; "dpo": preference records become Pairs (and only those).
    objective: str = "sft"


@dataclass
class LoadedData:
    """A file's examples in file order (a list, or `ArrowExamples` memory-mapped from the token
    cache), and the records left out (no loss tokens within max_seq_len), by line number."""

    examples: Sequence[Example]  # Pairs (below) for a DPO job
    dropped: list[int]
    records: int

    @property
    def dropped_fraction(self) -> float:
        return len(self.dropped) / self.records if self.records else 0.0

    @property
    def lengths(self) -> np.ndarray:
        """Tokens per example (without touching the examples when they are memory-mapped)."""
        known = getattr(self.examples, "lengths", None)
        return known if known is not None else np.array([example_tokens(e) for e in self.examples], dtype=np.int64)

    @property
    def loss_tokens(self) -> int:
        known = getattr(self.examples, "loss_tokens", None)
        return int(known) if known is not None else sum(e.loss_tokens for e in self.examples)


def example_tokens(example: Any) -> int:
    """Tokens of an Example, or of both conversations of a preference Pair."""
    tokens = getattr(example, "tokens", None)
    return tokens if tokens is not None else len(example.input_ids)


def _eos_appended(tokenizer: Any, ids: list[int], trained: list[bool]) -> tuple[list[int], list[bool]]:
    eos = tokenizer.eos_token_id
    if eos is not None and (not ids or ids[-1] != eos):
        return ids + [eos], trained + [True]
    return ids, trained


def _tokenize_pair(tokenizer: Any, prompt: str, completion: str) -> tuple[list[int], list[bool]]:
    """One sequence, prompt then completion, tokenised as a whole (tokenising the halves apart
    adds a spurious word-start token under SentencePiece-style tokenizers); a token is trained
    when any of its characters belong to the completion. EOS ends the completion."""
    if getattr(tokenizer, "is_fast", False):
        encoded = tokenizer(prompt + completion, add_special_tokens=True, return_offsets_mapping=True)
        boundary = len(prompt)
        ids = list(encoded["input_ids"])
        trained = [e > boundary and e > s for s, e in encoded["offset_mapping"]]
    else:
        prompt_ids = tokenizer(prompt, add_special_tokens=True)["input_ids"]
        completion_ids = tokenizer(completion, add_special_tokens=False)["input_ids"]
        ids = list(prompt_ids) + list(completion_ids)
        trained = [False] * len(prompt_ids) + [True] * len(completion_ids)
    return _eos_appended(tokenizer, ids, trained)


def _tokenize_text(tokenizer: Any, text: str) -> tuple[list[int], list[bool]]:
    ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])
    return _eos_appended(tokenizer, ids, [True] * len(ids))


def tokenize_record(tokenizer: Any, record: dict[str, Any], options: TokenizeOptions | int) -> Example:
    """Tokenize one record of any supported shape, truncated to `max_seq_len` tokens.

    Raises TemplateError when the model's chat template cannot render a chat record."""
    if isinstance(options, int):
        options = TokenizeOptions(max_seq_len=options)
    if "messages" in record:
        ids, trained = tokenize_chat(tokenizer, record["messages"], record.get("tools"),
                                     options.train_on, options.system_message)
    elif "prompt" in record:
        ids, trained = _tokenize_pair(tokenizer, record["prompt"], record["completion"])
    elif "label" in record:
        ids, trained = _tokenize_pair(tokenizer, record["text"], str(record["label"]))
    else:
        ids, trained = _tokenize_text(tokenizer, record["text"])
    labels = [t if keep else IGNORE_INDEX for t, keep in zip(ids, trained)]
    n = options.max_seq_len
    return Example(ids[:n], labels[:n])


def tokenize_file(path: str, tokenizer: Any, options: TokenizeOptions) -> Iterator[tuple[int, Any]]:
    """(line, example) for every record of a data file, in order; the example is None for a
    record with no trained token within max_seq_len (a preference pair: when either reply has
    none). Raises DataError on the first record that is malformed, of the wrong kind for the
    objective, or that the template refuses."""
    for lineno, record, parse_error in iter_records(Path(path), columns=dict(options.columns)):
        if parse_error:
            raise DataError(path, lineno, "line", parse_error)
        fmt, problems = check_record(record)
        if problems:
            raise DataError(path, lineno, *problems[0])
        if (fmt == "preference") != (options.objective == "dpo"):
            raise DataError(path, lineno, "record", WRONG_KIND[options.objective], "wrong_record_kind")
        try:
            if fmt == "preference":
                example: Any = tokenize_preference(tokenizer, record, options.max_seq_len, options.system_message)
            else:
                example = tokenize_record(tokenizer, record, options)
        except TemplateError as exc:
            raise DataError(path, lineno, exc.field, str(exc), exc.rule) from None
        trained = (example.chosen.loss_tokens and example.rejected.loss_tokens
                   if isinstance(example, Pair) else example.loss_tokens)
        yield lineno, (example if trained else None)


#: Why a record cannot train under a job's objective.
WRONG_KIND = {
    "sft": "is a preference pair (preferred_output / non_preferred_output): train it with "
           'method {"type": "dpo"}, or give chat, prompt/completion or text records',
    "dpo": "is not a preference pair: a DPO job trains on records of the shape {\"input\": {\"messages\": "
           '[...]}, "preferred_output": [{"role": "assistant", ...}], "non_preferred_output": [...]}',
}


def check_loaded(path: str, records: int, kept: int, first_dropped: int | None, options: TokenizeOptions) -> None:
    """Raises DataError for a file with no records, or none left to train on."""
    if records == 0:
        raise DataError(path, 0, "file", "has no records", "empty_file")
    if kept == 0:
        raise DataError(path, first_dropped or 0, "record",
                        f"no record has a trained token within max_seq_len={options.max_seq_len}: "
                        "raise max_seq_len or shorten the prompts", "no_loss_tokens")


def load_examples(path: str, tokenizer: Any, options: TokenizeOptions | int) -> LoadedData:
    """Read, check and tokenize every record of a data file (JSONL, Parquet, CSV, or a
    `datasets` directory), into memory.

    Records with no trained token within max_seq_len are left out and listed in `dropped`.
    Raises DataError on the first record that is malformed or that the template refuses, and
    when no record is left.
    """
    if isinstance(options, int):
        options = TokenizeOptions(max_seq_len=options)
    examples: list[Example] = []
    dropped: list[int] = []
    records = 0
    for lineno, example in tokenize_file(path, tokenizer, options):
        records += 1
        if example is None:
            dropped.append(lineno)
        else:
            examples.append(example)
    check_loaded(path, records, len(examples), dropped[0] if dropped else None, options)
    return LoadedData(examples, dropped, records)


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
    import torch

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


# --- preference pairs (DPO) ---------------------------------------------------------------


@dataclass(frozen=True)
class Pair:
    """A prompt's preferred (chosen) and non-preferred (rejected) conversation, tokenised."""

    chosen: Example
    rejected: Example

    @property
    def tokens(self) -> int:
        return len(self.chosen.input_ids) + len(self.rejected.input_ids)

    @property
    def loss_tokens(self) -> int:
        return self.chosen.loss_tokens + self.rejected.loss_tokens


def tokenize_preference(tokenizer: Any, record: dict[str, Any], max_seq_len: int,
                        system_message: str = "keep") -> Pair:
    """The pair's two conversations, each truncated to `max_seq_len`, trained on the reply only.
    Raises TemplateError when the template refuses the conversation."""
    prompt = record[INPUT]
    out = []
    for key in (PREFERRED, NON_PREFERRED):
        reply = {k: v for k, v in record[key][0].items() if k != "weight"}
        ids, trained = tokenize_chat(tokenizer, [*prompt["messages"], reply], prompt.get("tools"),
                                     "last_assistant", system_message)
        labels = [t if keep else IGNORE_INDEX for t, keep in zip(ids, trained)]
        out.append(Example(ids[:max_seq_len], labels[:max_seq_len]))
    return Pair(*out)
