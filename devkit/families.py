"""Tiny random-weight models of real model families, built offline (the conformance kit).

    python -m devkit.families --out assets/models           # build what is out of date
    python -m devkit.families --out assets/models --only qwen3

Each `assets/models/tiny-<family>/` is a Hugging Face directory of that family's architecture
(its `model_type`, its architecture-defining config values, its tied or untied embeddings) at a
toy size, with a tokenizer that carries the family's special tokens, BOS/EOS behaviour,
tokenizer style (byte-level BPE or SentencePiece-style `▁` pieces) and its verbatim chat
template (`family_specs.py`, which cites each source). The vocabulary itself is a small BPE
trained here on the bundled prose, so no real tokenizer file is needed: what a fine-tuning
service must get right about a family (rendering, special tokens, where turns start and end,
attention, packing, tied weights, LoRA module names) is all there; the weights are random.

They load through the same `from_pretrained` path as any checkpoint. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, Iterable

from devkit.family_specs import FAMILIES
from devkit.tiny_data import SEED, facts, story

BUILD_INFO = "tiny_build.json"
VOCAB_SIZE = 1024
#: The toy size every family is built at (each family's own config values are kept). Two query
#: heads share one key/value head (grouped-query attention, as the families do) and a head is 32
#: wide: the smallest head vLLM's CPU attention computes (real families' are 64-256).
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 1024}
#: Families whose config names the head size explicitly (kept consistent with the toy size).
HEAD_DIM = 32


def model_name(family: str) -> str:
    return f"tiny-{family}"


def _corpus() -> list[str]:
    rng = random.Random(f"{SEED}:families")
    texts = [story(rng) if i % 2 else facts(rng) for i in range(1500)]
    # The words chat records and tool calls use, so tests read naturally when decoded.
    texts += ["You are a helpful assistant. What is the capital of France? Paris is the capital. "
              "The weather is sunny today. Call the weather tool for the city. Thank you."] * 20
    return texts


def build_tokenizer(spec: dict[str, Any]):
    """A BPE trained on the bundled prose, shaped like the family's tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = spec["tokenizer"]
    named = {k: tok.get(f"{k}_token") for k in ("bos", "eos", "pad", "unk")}
    specials = list(dict.fromkeys([t for t in named.values() if t] + list(tok.get("special_tokens", []))))
    if tok["style"] == "sentencepiece":
        backend = Tokenizer(models.BPE(unk_token=named["unk"] or None, fuse_unk=True))
        backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        backend.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
        alphabet = [chr(c) for c in range(32, 127)] + ["\u2581", "\n", "\t"]
    else:
        backend = Tokenizer(models.BPE())
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=specials,
                                  initial_alphabet=alphabet, show_progress=False)
    backend.train_from_iterator(_corpus(), trainer=trainer)
    steps = [processors.ByteLevel(trim_offsets=False)] if tok["style"] != "sentencepiece" else []
    if tok.get("add_bos_token") and named["bos"]:
        bos = named["bos"]
        steps.append(processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B:1",
            special_tokens=[(bos, backend.token_to_id(bos))]))
    if steps:
        backend.post_processor = processors.Sequence(steps)
    extra = [t for t in specials if t not in named.values()]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, **{f"{k}_token": v for k, v in named.items() if v},
        additional_special_tokens=extra, model_max_length=TINY["max_position_embeddings"],
        clean_up_tokenization_spaces=False,
    )
    if spec.get("chat_template"):
        tokenizer.chat_template = spec["chat_template"]
    return tokenizer


def build_config(spec: dict[str, Any], tokenizer):
    from transformers import AutoConfig

    values = dict(TINY)
    values.update({k: v for k, v in spec.get("config", {}).items()})
    if "head_dim" in spec.get("config", {}) or spec.get("text_model_type", spec["model_type"]) in (
            "gemma2", "gemma3_text", "qwen3"):
        values["head_dim"] = HEAD_DIM
    if spec["model_type"] == "opt":
        values.update(ffn_dim=values.pop("intermediate_size"), word_embed_proj_dim=values["hidden_size"])
        values.pop("num_key_value_heads")
    if spec["model_type"] in ("gpt2", "bloom", "gpt_neox", "opt"):
        values.pop("num_key_value_heads", None)
    if spec["model_type"] in ("gpt2", "bloom"):
        values.pop("intermediate_size", None)
    values["vocab_size"] = len(tokenizer)
    values["tie_word_embeddings"] = spec["tie_word_embeddings"]
    for k in ("bos", "eos", "pad"):
        values[f"{k}_token_id"] = getattr(tokenizer, f"{k}_token_id")
    if spec.get("text_model_type"):  # a multimodal checkpoint: the text values nest in text_config
        values.pop("tie_word_embeddings")
        text = AutoConfig.for_model(spec["text_model_type"], **values).to_dict()
        vision = dict(spec["vision_config"])
        images = {k: tokenizer.convert_tokens_to_ids(t) for k, t in spec.get("image_tokens", {}).items()}
        return AutoConfig.for_model(
            spec["model_type"], text_config=text, vision_config=vision, architectures=[spec["architecture"]],
            tie_word_embeddings=spec["tie_word_embeddings"], **spec.get("multimodal_config", {}), **images)
    values["architectures"] = [spec["architecture"]]
    return AutoConfig.for_model(spec["model_type"], **values)


def builder_hash(family: str) -> str:
    digest = hashlib.sha256(Path(__file__).read_bytes())
    digest.update(json.dumps(FAMILIES[family], sort_keys=True).encode())
    return digest.hexdigest()


def is_current(target: Path, family: str) -> bool:
    try:
        info = json.loads((target / BUILD_INFO).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return info.get("builder_sha256") == builder_hash(family) and (target / "config.json").is_file()


def build(family: str, target: Path) -> None:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    spec = FAMILIES[family]
    tokenizer = build_tokenizer(spec)
    config = build_config(spec, tokenizer)
    torch.manual_seed(SEED)
    model = AutoModelForCausalLM.from_config(config)
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    info = {"builder": "devkit/families.py", "builder_sha256": builder_hash(family), "family": family,
            "hub_id": spec.get("hub_id"), "chat_template_source": spec.get("source"),
            "parameters": sum(p.numel() for p in model.parameters()),
            "torch": torch.__version__, "transformers": transformers.__version__}
    (tmp / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(tmp, target)
    print(f"built {target} ({spec['architecture']}, vocabulary {len(tokenizer)}, "
          f"{info['parameters']:,} parameters) in {time.perf_counter() - started:.1f}s")


def main(argv: Iterable[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m devkit.families", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("assets/models"))
    parser.add_argument("--only", action="append", choices=sorted(FAMILIES), help="build this family only")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(None if argv is None else list(argv))
    for family in args.only or sorted(FAMILIES):
        target = args.out / model_name(family)
        if not args.force and is_current(target, family):
            print(f"up to date: {target}")
            continue
        build(family, target)


if __name__ == "__main__":
    main()
