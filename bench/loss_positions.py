"""The loss's output projection on trained positions only, against every position.

    .venv/bin/python bench/loss_positions.py                 # writes its section of BENCHMARKS.md
    .venv/bin/python bench/loss_positions.py --output /tmp/l.md

The training loss (`training/steps.py:token_loss_sum`) passes the model a `logits_to_keep` mask
of the positions that predict a trained token, so the output projection, the logits and the
softmax cover those rows only. This bench times one training micro-batch (forward, the chunked
loss, backward; LoRA r 8 on all linear layers, fp32 on the CPU) both ways on the same packed row,
in alternating order (A, B, B, A, ...) after a warm-up round, and reports the median of each and their ratio; then the output projection and the loss alone
(forward and backward from the final hidden states, twice as many rounds), the part that differs. Models built from config
(random weights, nothing downloaded): the speed bench's Llama (hidden 256, 6 layers, the bundled
tokenizer's 1,197-entry vocabulary) and Qwen2.5-0.5B's own configuration (24 layers, hidden 896,
a 151,936-entry vocabulary, tied embeddings). Examples: the speed bench's log-normal lengths,
each with a prompt of 20-60% of its tokens that is not trained, packed end to end.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.report import replace_section  # noqa: E402

SECTION = "## Loss on trained positions only"

#: (label, config keyword arguments, tokens per micro-batch)
MODELS = [
    ("speed bench's Llama (6 x 256, vocabulary 1,197)", "llama",
     {"vocab_size": 1197, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 6,
      "num_attention_heads": 8, "num_key_value_heads": 4, "tie_word_embeddings": False}, 2048),
    ("Qwen2.5-0.5B's configuration (24 x 896, vocabulary 151,936)", "qwen2",
     {"vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
      "num_attention_heads": 14, "num_key_value_heads": 2, "tie_word_embeddings": True,
      "max_window_layers": 21, "rope_theta": 1000000.0}, 512),
]


def examples(tokens: int, vocab: int, seed: int = 7):
    """Prompt/completion examples of the speed bench's lengths, filling `tokens`."""
    from eft.training.data import IGNORE_INDEX, Example

    rng = random.Random(seed)
    out, total = [], 0
    while True:
        n = int(min(480, max(16, rng.lognormvariate(4.6, 0.7))))
        if total + n > tokens:
            return out
        prompt = max(4, int(n * rng.uniform(0.2, 0.6)))
        ids = [rng.randrange(5, vocab) for _ in range(n)]
        out.append(Example(ids, [IGNORE_INDEX] * prompt + ids[prompt:]))
        total += n


def measure(kind: str, config: dict, tokens: int, repeats: int) -> dict:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from eft.training.attention import use_packed_attention
    from eft.training.packing import collate_packed, packed_inputs
    from eft.training.steps import next_token_targets, token_cross_entropy_sum, token_loss_sum

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **config), dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM"))
    use_packed_attention(model, "sdpa")
    model.train()
    host = collate_packed(examples(tokens, config["vocab_size"]), 0)
    batch = {**packed_inputs(host, torch.device("cpu"), "sdpa"), "labels": host["labels"]}
    targets = next_token_targets(host["labels"])

    def every_position() -> torch.Tensor:  # the loss before: logits of every position
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        return token_cross_entropy_sum(model(**inputs, use_cache=False).logits, targets)

    ways = {"every": every_position, "trained": lambda: token_loss_sum(model, batch)}
    with torch.no_grad():
        losses = {name: float(way()) for name, way in ways.items()}
    times = alternating(ways, repeats, lambda: model.zero_grad(set_to_none=True))
    kept = int((targets != -100).sum())
    return {"tokens": int(host["input_ids"].numel()), "kept": kept, "examples": len(host["cu_seq_lens"]) - 1,
            "losses": losses, "times": times, "head": head_times(model, targets, repeats),
            "vocab": config["vocab_size"]}


def head_times(model, targets, repeats: int) -> dict[str, list[float]]:
    """The output projection and the loss alone (forward and backward, from the final hidden
    states), every position against the trained ones: the part that differs, without the
    decoder's time and its noise."""
    import torch

    from eft.training.steps import token_cross_entropy_sum

    head = model.get_output_embeddings()
    hidden = torch.randn(*targets.shape, head.in_features, requires_grad=True)
    keep = targets != -100
    ways = {"every": lambda: token_cross_entropy_sum(head(hidden), targets),
            "trained": lambda: token_cross_entropy_sum(head(hidden[keep]), targets[keep])}
    return alternating(ways, 2 * repeats, lambda: setattr(hidden, "grad", None))


def alternating(ways: dict, repeats: int, reset) -> dict[str, list[float]]:  # noqa: ANN001
    """Seconds of each way's loss and backward, `repeats` times each, in the order A, B, B, A, ...:
    whichever runs first in a round pays for memory the other freed. A first round warms both
    up and is not counted."""
    times: dict[str, list[float]] = {name: [] for name in ways}
    for round_ in range(repeats + 1):
        for name in (list(ways) if round_ % 2 == 0 else list(ways)[::-1]):
            reset()
            started = time.perf_counter()
            ways[name]().backward()
            if round_:
                times[name].append(time.perf_counter() - started)
    return times


def render(rows: list[tuple[str, dict]], repeats: int, seconds: float) -> str:
    from bench.speed import machine

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        SECTION, "",
        f"Written by `bench/loss_positions.py` on {when} in {seconds:.0f} s; {machine()}. One packed "
        f"micro-batch, forward + loss + backward, LoRA r 8 all-linear, fp32; median of {repeats} runs each way, "
        "in alternating order after a warm-up round (its docstring says how it measures).", "",
        "| model | tokens (examples) | trained positions | micro-batch, s: every / trained | speed-up | "
        "output projection + loss, ms: every / trained | logits + their gradient, MB: every / trained |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in rows:
        every, trained = statistics.median(r["times"]["every"]), statistics.median(r["times"]["trained"])
        head_every, head_trained = (statistics.median(r["head"][k]) * 1000 for k in ("every", "trained"))
        mb = lambda n: n * r["vocab"] * 8 / 1e6  # noqa: E731 - fp32 logits and their gradient
        lines.append(f"| {label} | {r['tokens']} ({r['examples']}) | {r['kept']} ({r['kept'] / r['tokens']:.0%}) | "
                     f"{every:.3f} / {trained:.3f} | **{every / trained:.2f}x** | {head_every:.0f} / "
                     f"{head_trained:.0f} | {mb(r['tokens']):.0f} / {mb(r['kept']):.0f} |")
    lines += ["", "The loss is the same either way (to fp32 round-off: "
              + "; ".join(f"{r['losses']['every']:.4f} vs {r['losses']['trained']:.4f}" for _, r in rows)
              + "); tests/training/test_families.py checks loss and gradients on every family's model."]
    return "\n".join(lines)


def run_models(description: str, section: str, measure, render, argv: list[str] | None) -> int:  # noqa: ANN001
    """A micro-batch bench's command line: `measure(kind, config, tokens, repeats)` on each of
    MODELS, then `render(rows, repeats, seconds)` printed and written as `section`."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--output", type=Path, default=ROOT / "BENCHMARKS.md")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(2)
    started = time.perf_counter()
    rows = [(label, measure(kind, config, tokens, args.repeats)) for label, kind, config, tokens in MODELS]
    text = render(rows, args.repeats, time.perf_counter() - started)
    print(text)
    replace_section(args.output, section, text)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_models(__doc__.splitlines()[0], SECTION, measure, render, argv)


if __name__ == "__main__":
    raise SystemExit(main())
