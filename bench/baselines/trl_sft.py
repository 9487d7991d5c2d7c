"""The strongest off-the-shelf baseline: TRL's `SFTTrainer` with packing, padding-free.

Run from the repository root (one process, or one per worker with torchrun, DDP over gloo):

    .venv/bin/python bench/baselines/trl_sft.py --model M --data D.jsonl --out r.json
    .venv/bin/torchrun --nproc-per-node 2 bench/baselines/trl_sft.py --model M --data D.jsonl --out r.json

The same examples as the product's job (tokenised with the product's own code, the prompt
masked in `labels`, which TRL takes as they are), packed by TRL's best-fit-decreasing strategy
into rows of `--max-seq-len` tokens, each micro-batch flattened into one padding-free row with
restarting position ids (transformers then masks attention block-diagonally). The rows per step
are chosen so that a step trains about as many tokens as the product's global batch of
`--global-batch` examples. LoRA r 8 on all linear layers, dropout 0, AdamW, cosine schedule,
clipping at 1.0, as the other baselines.

Writes, per rank, the end time of every optimizer step and the tokens of every micro-batch
(all real: nothing is padded).
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
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from eft.training.data import load_examples

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    examples = load_examples(args.data, tokenizer, args.max_seq_len).examples
    dataset = Dataset.from_list([{"input_ids": e.input_ids, "labels": e.labels} for e in examples])
    mean_len = sum(len(e.input_ids) for e in examples) / len(examples)
    rows_per_step = max(world, round(args.global_batch * mean_len / args.max_seq_len))
    per_device = max(1, rows_per_step // world)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa")

    step_ends: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_end(self, *a, **k):  # noqa: ANN002, ANN003, ANN202
            step_ends.append(time.perf_counter())

    config = SFTConfig(
        output_dir=str(Path(args.out).with_suffix(".trainer")), max_steps=args.steps,
        per_device_train_batch_size=per_device, gradient_accumulation_steps=1,
        learning_rate=2e-4, lr_scheduler_type="cosine", max_grad_norm=1.0, weight_decay=0.0,
        logging_steps=args.steps, save_strategy="no", report_to=[], seed=args.seed,
        dataloader_num_workers=0, use_cpu=True, ddp_backend="gloo" if world > 1 else None,
        disable_tqdm=True, max_length=args.max_seq_len, packing=True, packing_strategy="bfd",
        padding_free=True,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                                task_type="CAUSAL_LM"),
                         callbacks=[StepTimes()])
    micro_tokens: list[int] = []
    collate = trainer.data_collator

    def counting(features):  # noqa: ANN001, ANN202
        batch = collate(features)
        micro_tokens.append(int(batch["input_ids"].numel()))
        return batch

    trainer.data_collator = counting
    started = time.perf_counter()
    trainer.train()
    tokens = sum(micro_tokens[1 : args.steps])  # steps 2..N (step 1 is warm-up)
    result = {"rank": rank, "world": world, "tokens": tokens, "seconds": step_ends[-1] - step_ends[0],
              "steps": len(step_ends), "total_s": time.perf_counter() - started,
              "tokens_per_step": tokens * world / max(1, args.steps - 1), "rows_per_step": per_device * world}
    Path(f"{args.out}.rank{rank}").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
