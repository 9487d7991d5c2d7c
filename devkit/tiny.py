"""Build the bundled tiny base model and the demo datasets, offline and deterministically.

Run from the repository root (the Makefile does exactly this):

    python -m devkit.tiny --out assets             # data, then the model unless it is up to date
    python -m devkit.tiny --out assets --force     # rebuild the model even if it is up to date
    python -m devkit.tiny --out assets --data-only # write only assets/data/

It writes:

* ``<out>/data/demo/{chat,completion,text}_{train,valid}.jsonl`` and ``<out>/data/README.md``:
  small rule-based datasets (committed to the repository) in the three accepted shapes.
* ``<out>/models/tiny-llama/``: a Hugging Face directory (Llama architecture, byte-level BPE
  tokenizer with a chat template, safetensors weights) that ``AutoModelForCausalLM`` and
  ``AutoTokenizer`` load with ``from_pretrained``. The weights come from a short seeded
  pretraining run on synthetic prose, so the base model babbles words rather than noise and
  the demo LoRA job has something to adapt.

Nothing is downloaded. The datasets are byte-identical on every run; the model is rebuilt
byte-identical on a given machine and library versions (CPU floating point may differ across
machines). A model directory whose recorded builder hash matches this file is left alone, so
re-running is cheap; editing this file makes the next run rebuild, as make expects.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import time
from pathlib import Path
from typing import Iterable

from devkit.tiny_data import NOT_IN_TOKENIZER, SEED, echo, facts, story, write_data

MODEL_NAME = "tiny-llama"
BUILD_INFO = "tiny_build.json"  # records which builder produced the directory
REQUIRED_MODEL_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    BUILD_INFO,
)

BOS, EOS, PAD, UNK = "<s>", "</s>", "<pad>", "<unk>"
ROLE_MARKERS = ("<|system|>", "<|user|>", "<|assistant|>")
END_OF_TURN = "<|end|>"
SPECIAL_TOKENS = (PAD, UNK, BOS, EOS, *ROLE_MARKERS, END_OF_TURN)
# An upper bound: the synthetic language runs out of useful merges first (about 1.2k tokens).
VOCAB_SIZE = 1536

# Each turn is "<|role|>\n{content}<|end|>\n". Only the assistant's content and its <|end|> sit
# inside {% generation %}, so return_assistant_tokens_mask marks exactly the tokens a
# fine-tuning job should learn; the role header and the trailing newline stay unmasked.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>\n' }}"
    "{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}"
    "{{ '\n' }}"
    "{% elif message['role'] in ['system', 'user'] %}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{% else %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

# ----------------------------------------------------------------------------------------------
# The tokenizer.
# ----------------------------------------------------------------------------------------------


def train_tokenizer(corpus: list[str]):
    """A byte-level BPE (any text encodes, no unknowns) wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    # Like Llama: plain encodes start with <s>; chat encodes get it from the template instead
    # (apply_chat_template tokenizes without special tokens), so it is never doubled.
    bos_id = backend.token_to_id(BOS)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B:1", special_tokens=[(BOS, bos_id)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        additional_special_tokens=[*ROLE_MARKERS, END_OF_TURN],
        model_max_length=1024,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# ----------------------------------------------------------------------------------------------
# The model.
# ----------------------------------------------------------------------------------------------

PRETRAIN_DOCS = 6000
PRETRAIN_MIX = (0.4, 0.4, 0.2)  # story, facts, echo
PRETRAIN_STEPS = 300
PRETRAIN_BATCH = 16
PRETRAIN_SEQ_LEN = 128
PRETRAIN_LR = 3e-3
# A fixed thread count, not "all cores": CPU kernels may split reductions by thread count, and
# the weights should not depend on the machine's core count. Two threads is fast enough here.
TORCH_THREADS = 2


def pretrain_corpus() -> list[str]:
    """Prose the base model learns language from: stories, and facts the way a real base model
    has read them. Deliberately no questions or chat: answering in the chat format is what
    the demo fine-tuning job teaches."""
    rng = random.Random(f"{SEED}:pretrain")
    kinds = rng.choices((story, facts, echo), weights=PRETRAIN_MIX, k=PRETRAIN_DOCS)
    return [make(rng) for make in kinds]


def tokenizer_corpus(splits: dict[str, list[dict]], prose: list[str]) -> list[str]:
    """Everything the tokenizer should encode compactly: the prose and every dataset string."""
    texts = list(prose)
    for name, rows in splits.items():
        if name.rsplit("_", 1)[0] in NOT_IN_TOKENIZER:
            continue
        for row in rows:
            if "preferred_output" in row:
                continue  # the preference pairs reuse the chat skills' strings (and keep the tokenizer as it was)
            if "messages" in row:
                texts.extend(message["content"] for message in row["messages"])
            else:
                texts.append(row.get("text") or row["prompt"] + row["completion"])
    return texts


def make_config(tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def pack(tokenizer, texts: list[str], seq_len: int):
    """Concatenate <s> doc </s> ... and cut into equal blocks: no padding, no wasted compute."""
    import torch

    stream: list[int] = []
    for ids in tokenizer(texts)["input_ids"]:  # the tokenizer already prepends <s>
        stream.extend(ids + [tokenizer.eos_token_id])
    blocks = len(stream) // seq_len
    return torch.tensor(stream[: blocks * seq_len]).view(blocks, seq_len)


def pretrain(model, blocks, steps: int) -> list[float]:
    """Seeded full training with AdamW, linear warmup then cosine decay; returns the losses."""
    import torch

    generator = torch.Generator().manual_seed(SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=PRETRAIN_LR, weight_decay=0.01)
    warmup = steps // 10

    def lr_factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    model.train()
    losses = []
    for step in range(steps):
        batch = blocks[torch.randint(len(blocks), (PRETRAIN_BATCH,), generator=generator)]
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            print(f"  pretrain step {step + 1}/{steps} loss {loss.item():.3f}")
    model.eval()
    return losses


def builder_hash() -> str:
    """Identifies the recipe: when this file or the data's changes, the model is rebuilt (as
    make expects)."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update((Path(__file__).parent / "tiny_data.py").read_bytes())
    return digest.hexdigest()


def model_is_current(target: Path) -> bool:
    if not all((target / name).is_file() for name in REQUIRED_MODEL_FILES):
        return False
    try:
        info = json.loads((target / BUILD_INFO).read_text(encoding="utf-8"))
    except ValueError:
        return False
    return info.get("builder_sha256") == builder_hash()


def generation_config(tokenizer):
    from transformers import GenerationConfig

    end_of_turn = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    return GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        # A chat reply ends with <|end|>, plain text with </s>: stop on either.
        eos_token_id=[tokenizer.eos_token_id, end_of_turn],
        pad_token_id=tokenizer.pad_token_id,
        max_new_tokens=64,
    )


def save_model(target: Path, model, tokenizer, info: dict) -> None:
    """Save into a sibling temporary directory and swap it in, so that a crash mid-build never
    leaves a directory that looks complete (the Makefile keys on config.json)."""
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)


def build_model(target: Path, splits: dict[str, list[dict]]) -> None:
    import torch
    import transformers
    from transformers import LlamaForCausalLM

    started = time.perf_counter()
    torch.set_num_threads(TORCH_THREADS)
    torch.manual_seed(SEED)
    prose = pretrain_corpus()
    tokenizer = train_tokenizer(tokenizer_corpus(splits, prose))
    model = LlamaForCausalLM(make_config(tokenizer))
    model.generation_config = generation_config(tokenizer)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"training {MODEL_NAME}: {n_params:,} parameters, vocabulary {len(tokenizer)}")
    losses = pretrain(model, pack(tokenizer, prose, PRETRAIN_SEQ_LEN), PRETRAIN_STEPS)
    info = {
        "builder": "devkit/tiny.py",
        "builder_sha256": builder_hash(),
        "seed": SEED,
        "parameters": n_params,
        "pretrain_steps": PRETRAIN_STEPS,
        "pretrain_loss_first": round(losses[0], 4),
        "pretrain_loss_last": round(losses[-1], 4),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    save_model(target, model, tokenizer, info)
    for path in sorted(target.iterdir()):
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    print(f"built {target} in {time.perf_counter() - started:.1f}s")


# ----------------------------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------------------------


def parse_args(argv: Iterable[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m devkit.tiny",
        description="Build the bundled tiny-llama base model and the demo datasets (offline).",
    )
    parser.add_argument("--out", type=Path, default=Path("assets"), help="output root (assets)")
    parser.add_argument("--force", action="store_true", help="rebuild the model even if current")
    parser.add_argument("--data-only", action="store_true", help="write only <out>/data")
    return parser.parse_args(None if argv is None else list(argv))


def main(argv: Iterable[str] | None = None) -> None:
    args = parse_args(argv)
    # The tokenizer is trained on the datasets' strings, so they are generated on every run.
    splits = write_data(args.out)
    if args.data_only:
        return
    target = args.out / "models" / MODEL_NAME
    if not args.force and model_is_current(target):
        print(f"up to date: {target} (use --force to rebuild)")
        return
    build_model(target, splits)


if __name__ == "__main__":
    main()
