"""The baseline a user would write instead of this product: `transformers.Trainer` + PEFT LoRA.

Run from the repository root (one process, or one per worker with torchrun, DDP over gloo):

    .venv/bin/python bench/baselines/hf_trainer.py --model M --data D.jsonl --out r.json
    .venv/bin/torchrun --nproc-per-node 2 bench/baselines/hf_trainer.py --model M --data D.jsonl --out r.json

The usual recipe: examples tokenised once (with the product's own tokeniser code, so both see
identical tokens), `DataCollatorForSeq2Seq` padding each micro-batch to its longest example,
gradient accumulation making up the global batch, AdamW, cosine schedule, clipping at 1.0;
LoRA r 8 on all linear layers with PEFT's default dropout (0), as the product's job. With
`--sampling group_by_length` (`train_sampling_strategy`), micro-batches are drawn from examples
of similar length (transformers' `LengthGroupedSampler`), which cuts the padding: the strongest
setting a Trainer user has for variable-length data.

It writes, per rank, the end time of every optimizer step and the non-padding tokens of every
micro-batch the collator built; `bench/throughput.py` turns those into useful tokens/s over
steps 2..N (step 1 is warm-up on both sides).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--sampling", default="random", choices=["random", "group_by_length"])
    parser.add_argument("--lora-dropout", type=float, default=0.0)
    args = parser.parse_args()

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import (AutoModelForCausalLM, AutoTokenizer, DataCollatorForSeq2Seq, Trainer,
                              TrainerCallback, TrainingArguments)

    from eft.training.data import load_examples

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    rows = [{"input_ids": e.input_ids, "labels": e.labels, "attention_mask": [1] * len(e.input_ids)}
            for e in load_examples(args.data, tokenizer, args.max_seq_len).examples]
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=args.lora_dropout,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))

    micro_tokens: list[int] = []
    pad = DataCollatorForSeq2Seq(tokenizer, padding="longest", label_pad_token_id=-100)

    def collate(features):  # noqa: ANN001, ANN202
        batch = pad(features)
        micro_tokens.append(int(batch["attention_mask"].sum()))
        return batch

    step_ends: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_end(self, *a, **k):  # noqa: ANN002, ANN003, ANN202
            step_ends.append(time.perf_counter())

    accumulation = args.global_batch // (args.micro_batch * world)
    training_args = TrainingArguments(
        output_dir=str(Path(args.out).with_suffix(".trainer")), max_steps=args.steps,
        per_device_train_batch_size=args.micro_batch, gradient_accumulation_steps=accumulation,
        learning_rate=2e-4, lr_scheduler_type="cosine", max_grad_norm=1.0, weight_decay=0.0,
        logging_steps=args.steps, save_strategy="no", report_to=[], seed=args.seed,
        dataloader_num_workers=0, remove_unused_columns=False, use_cpu=True, ddp_backend="gloo" if world > 1 else None,
        disable_tqdm=True, train_sampling_strategy=args.sampling,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=rows, data_collator=collate,
                      callbacks=[StepTimes()])
    started = time.perf_counter()
    trainer.train()
    # Step 1 is warm-up; count the micro-batches of steps 2..N (the loader may build one more).
    tokens = sum(micro_tokens[accumulation : args.steps * accumulation])
    result = {"rank": rank, "world": world, "tokens": tokens, "seconds": step_ends[-1] - step_ends[0],
              "steps": len(step_ends), "total_s": time.perf_counter() - started}
    Path(f"{args.out}.rank{rank}").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
