"""Preference tuning (DPO) against the reference implementation and real chat templates.

- The loss of one batch equals TRL's `DPOTrainer` on the same model (a LoRA adapter on a real
  family's tiny model, its reference the base with the adapter off), pairs and beta, in fp32.
- The loss and its gradient are the same packed (pairs laid end to end in one row) as padded.
- Each family's template: a pair's two conversations share the prompt's tokens and train on
  exactly the reply's turn, as supervised chat training marks it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from eft.training.attention import VARLEN_NAMES, register as register_varlen
from eft.training.chat import tokenize_chat
from eft.training.data import IGNORE_INDEX, DataError, Example, Pair, TokenizeOptions, load_examples, tokenize_preference
from devkit.families import model_name
from devkit.family_specs import FAMILIES
from eft.training.packing import collate_packed, packed_inputs
from eft.training.preference import micro_batch_loss, pair_logps, pair_sequences, sequence_bounds
from eft.training.data import collate
from tests.helpers.paths import REPO

MODELS = REPO / "assets" / "models"
DATA = REPO / "assets" / "data" / "demo"
CHAT_FAMILIES = [f for f in sorted(FAMILIES) if FAMILIES[f].get("chat_template")]

RECORDS = [
    {"input": {"messages": [{"role": "user", "content": "What is 2 plus 3?"}]},
     "preferred_output": [{"role": "assistant", "content": "2 plus 3 is 5."}],
     "non_preferred_output": [{"role": "assistant", "content": "The sky is blue."}]},
    {"input": {"messages": [{"role": "system", "content": "Answer briefly."},
                            {"role": "user", "content": "What is the opposite of hot?"}]},
     "preferred_output": [{"role": "assistant", "content": "The opposite of hot is cold."}],
     "non_preferred_output": [{"role": "assistant", "content": "The opposite of hot is big, I think."}]},
    {"input": {"messages": [{"role": "user", "content": "Name a color."},
                            {"role": "assistant", "content": "Red."},
                            {"role": "user", "content": "Another one?"}]},
     "preferred_output": [{"role": "assistant", "content": "Blue."}],
     "non_preferred_output": [{"role": "assistant", "content": "No."}]},
]


def _lora(path: Path, seed: int = 0):
    from peft import LoraConfig, get_peft_model

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(seed)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                             init_lora_weights=False, task_type="CAUSAL_LM"))
    return model


def _our_loss(model, pairs: list[Pair], pad_id: int, beta: float, packed: bool = False) -> torch.Tensor:
    """The mean DPO loss of `pairs` as the training loop computes it (training/loop.py)."""
    sequences = pair_sequences(pairs)
    host = collate_packed(sequences, pad_id) if packed else collate(sequences, pad_id)
    sequence_spans = sequence_bounds(host)
    batch = packed_inputs(host, torch.device("cpu"), "sdpa") if packed else dict(host)
    batch["labels"] = host["labels"]
    with torch.no_grad(), model.disable_adapter():
        reference = pair_logps(model, batch, sequence_spans)
    loss_sum, _ = micro_batch_loss(pair_logps(model, batch, sequence_spans), reference, beta)
    return loss_sum / len(pairs)


@pytest.mark.parametrize("family", ["qwen3", "llama-3.1"])
def test_loss_equals_trl_dpo_trainer(family, tmp_path):
    """One batch of TRL's DPOTrainer (its own tokenisation, collator and loss) against ours on
    the very token ids TRL made, same model, pairs and beta: equal to rel 1e-5 (fp32, CPU)."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    path = MODELS / model_name(family)
    tokenizer = AutoTokenizer.from_pretrained(path)
    beta = 0.25
    rows = [{"prompt": r["input"]["messages"], "chosen": r["preferred_output"],
             "rejected": r["non_preferred_output"]} for r in RECORDS[:2]]
    args = DPOConfig(output_dir=str(tmp_path), beta=beta, per_device_train_batch_size=2, report_to=[],
                     use_cpu=True, bf16=False, fp16=False, max_length=None, dataloader_num_workers=0,
                     dataset_num_proc=None, seed=0)
    from peft import LoraConfig

    # TRL adds the adapter (random, not zero: the policy differs from the reference); handed a
    # model with an adapter already, it would take that adapter's initial copy as the reference.
    torch.manual_seed(0)
    trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), args=args,
                         train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                                init_lora_weights=False, task_type="CAUSAL_LM"))
    assert list(trainer.model.peft_config) == ["default"]  # the reference is the base, adapter off
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    trl_loss = trainer.compute_loss(trainer.model, batch)

    # TRL's tokens, in TRL's batch order: [chosen..., rejected...] with its completion masks.
    n = batch["input_ids"].shape[0] // 2
    examples = []
    for row in range(2 * n):
        length = int(batch["attention_mask"][row].sum())
        ids = batch["input_ids"][row, :length].tolist()
        mask = batch["completion_mask"][row, :length].tolist()
        examples.append(Example(ids, [t if m else IGNORE_INDEX for t, m in zip(ids, mask)]))
    pairs = [Pair(examples[i], examples[n + i]) for i in range(n)]
    ours = _our_loss(trainer.model, pairs, tokenizer.pad_token_id or 0, beta)
    assert abs(trl_loss.item() - 0.6931) > 1e-3  # not log 2: the policy is not the reference
    assert ours.item() == pytest.approx(trl_loss.item(), rel=1e-5)


def test_packed_equals_padded_with_gradients():
    """Pairs packed end to end in one row (per-example attention) give the padded batch's loss
    and adapter gradients."""
    path = MODELS / model_name("qwen3")
    tokenizer = AutoTokenizer.from_pretrained(path)
    pairs = [tokenize_preference(tokenizer, r, 512) for r in RECORDS]
    results = []
    for packed in (False, True):
        register_varlen()
        from peft import LoraConfig, get_peft_model

        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                    attn_implementation=VARLEN_NAMES["sdpa"])
        torch.manual_seed(0)
        model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                                init_lora_weights=False, task_type="CAUSAL_LM"))
        loss = _our_loss(model, pairs, tokenizer.pad_token_id, 0.1, packed=packed)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])
        results.append((loss.detach(), grads))
    (padded, g_padded), (packed, g_packed) = results
    assert packed.item() == pytest.approx(padded.item(), rel=1e-5)
    assert torch.allclose(g_packed, g_padded, rtol=1e-4, atol=1e-6)
    assert g_padded.abs().sum() > 0


@pytest.mark.parametrize("family", CHAT_FAMILIES)
def test_pair_trains_on_the_reply_turn_only(family):
    """Chosen and rejected share every token before the reply, and train on exactly the reply's
    turn as supervised training marks an assistant turn (its end-of-turn marker included)."""
    tokenizer = AutoTokenizer.from_pretrained(MODELS / model_name(family))
    record = RECORDS[2] if family not in ("gemma-2", "mistral-v0.1") else RECORDS[0]
    pair = tokenize_preference(tokenizer, record, 4096)
    for example, key in ((pair.chosen, "preferred_output"), (pair.rejected, "non_preferred_output")):
        messages = [*record["input"]["messages"], record[key][0]]
        ids, trained = tokenize_chat(tokenizer, messages, None, "last_assistant")
        assert example.input_ids == ids
        assert example.labels == [t if k else IGNORE_INDEX for t, k in zip(ids, trained)]
        first = next(i for i, t in enumerate(example.labels) if t != IGNORE_INDEX)
        # the trained run is contiguous and holds the reply
        trained_run = [i for i, t in enumerate(example.labels) if t != IGNORE_INDEX]
        assert trained_run == list(range(first, trained_run[-1] + 1))
        assert record[key][0]["content"] in tokenizer.decode([example.input_ids[i] for i in trained_run])
    start = min(next(i for i, t in enumerate(e.labels) if t != IGNORE_INDEX) for e in (pair.chosen, pair.rejected))
    assert pair.chosen.input_ids[:start] == pair.rejected.input_ids[:start]


def test_preference_file_loads_and_other_kinds_are_refused(tmp_path):
    """The bundled preference file loads as pairs under the DPO objective; a chat file under DPO,
    and a preference file under supervised training, are refused naming the line and the fix."""
    tokenizer = AutoTokenizer.from_pretrained(MODELS / model_name("qwen3"))
    loaded = load_examples(str(DATA / "preference_train.jsonl"), tokenizer, TokenizeOptions(256, objective="dpo"))
    assert loaded.records == 600 and len(loaded.examples) == 600
    assert all(isinstance(p, Pair) and p.chosen.loss_tokens and p.rejected.loss_tokens for p in loaded.examples)
    with pytest.raises(DataError, match="line 1: record: is not a preference pair"):
        load_examples(str(DATA / "chat_train.jsonl"), tokenizer, TokenizeOptions(256, objective="dpo"))
    with pytest.raises(DataError, match='line 1: record: is a preference pair.*"dpo"'):
        load_examples(str(DATA / "preference_train.jsonl"), tokenizer, TokenizeOptions(256))
    bad = tmp_path / "bad.jsonl"
    record = json.loads((DATA / "preference_train.jsonl").read_text().splitlines()[0])
    record["non_preferred_output"] = [{"role": "user", "content": "x"}]
    bad.write_text(json.dumps(record) + "\n")
    with pytest.raises(DataError, match=r"line 1: non_preferred_output\[0\]\.role: must be 'assistant'"):
        load_examples(str(bad), tokenizer, TokenizeOptions(256, objective="dpo"))
