"""LoRA's update fused into one matrix product, against PEFT's own forward.

    .venv/bin/python bench/lora_fused.py                 # writes its section of BENCHMARKS.md
    .venv/bin/python bench/lora_fused.py --output /tmp/f.md

PEFT's `lora.Linear` adds ``lora_B(lora_A(x)) * scaling`` to the base layer's output: two passes
over the full output (the scaling, the sum) and a third in the backward. The product's training
loop (`training/lora.py`) puts the scaling on the rank-sized activation and the sum into one
`addmm`. This bench times one training micro-batch (forward, the loss, backward; LoRA r 8 on all
linear layers, fp32 on the CPU, the product's packed row and per-example attention) both ways on
the same model and row, in alternating order after a warm-up round, and reports the medians and
their ratio; then one LoRA layer of each model's MLP width alone (forward and backward), the part
that differs. Models built from config (random weights, nothing downloaded), the same two as
`bench/loss_positions.py`: the speed bench's Llama and Qwen2.5-0.5B's configuration.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
from bench.loss_positions import alternating, examples, run_models  # noqa: E402

SECTION = "## LoRA's update in one matrix product"


def _lora_model(kind: str, config: dict, fused: bool):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from eft.training.attention import use_packed_attention
    from eft.training.lora import fuse_lora_updates

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(kind, **config), dtype=torch.float32)
    # alpha 16 / r 8, the bench's; B starts non-zero so that the update is not a sum of zeros
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules="all-linear",
                                             task_type="CAUSAL_LM", init_lora_weights=False))
    layers = fuse_lora_updates(model, "ddp") if fused else 0
    use_packed_attention(model, "sdpa")
    model.train()
    return model, layers


def measure(kind: str, config: dict, tokens: int, repeats: int) -> dict:
    import torch

    from eft.training.packing import collate_packed, packed_inputs
    from eft.training.steps import token_loss_sum

    (peft, _), (fused, layers) = _lora_model(kind, config, False), _lora_model(kind, config, True)
    host = collate_packed(examples(tokens, config["vocab_size"]), 0)
    batch = {**packed_inputs(host, torch.device("cpu"), "sdpa"), "labels": host["labels"]}
    ways = {"peft": lambda: token_loss_sum(peft, batch), "fused": lambda: token_loss_sum(fused, batch)}
    with torch.no_grad():
        losses = {name: float(way()) for name, way in ways.items()}
    times = alternating(ways, repeats, lambda: (peft.zero_grad(set_to_none=True), fused.zero_grad(set_to_none=True)))
    return {"tokens": int(host["input_ids"].numel()), "layers": layers, "losses": losses, "times": times,
            "layer": layer_times(peft, fused, int(host["input_ids"].numel()), config, repeats)}


def layer_times(peft, fused, tokens: int, config: dict, repeats: int) -> dict[str, list[float]]:  # noqa: ANN001
    """One MLP up-projection with its LoRA (hidden -> intermediate), forward and backward on the
    micro-batch's token count: the layer where the full-width passes are largest."""
    import torch

    def up(model):  # noqa: ANN001, ANN202
        return next(m for n, m in model.named_modules() if n.endswith("mlp.up_proj"))

    x = torch.randn(1, tokens, config["hidden_size"], requires_grad=True)
    ways = {"peft": lambda: up(peft)(x).sum(), "fused": lambda: up(fused)(x).sum()}
    return alternating(ways, 4 * repeats, lambda: setattr(x, "grad", None))


def render(rows: list[tuple[str, dict]], repeats: int, seconds: float) -> str:
    from datetime import datetime, timezone

    from bench.speed import machine

    when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        SECTION, "",
        f"Written by `bench/lora_fused.py` on {when} in {seconds:.0f} s; {machine()}. One packed micro-batch, "
        f"forward + loss + backward, LoRA r 8 on all linear layers, fp32; median of {repeats} runs each way "
        "(the MLP layer alone: of four times as many), in alternating order after a warm-up round (its "
        "docstring says how it measures).", "",
        "| model | tokens | LoRA layers | micro-batch, s: PEFT / fused | speed-up | one MLP up-projection, ms: "
        "PEFT / fused | speed-up |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for label, r in rows:
        peft, fused = statistics.median(r["times"]["peft"]), statistics.median(r["times"]["fused"])
        layer_peft, layer_fused = (statistics.median(r["layer"][k]) * 1000 for k in ("peft", "fused"))
        lines.append(f"| {label} | {r['tokens']} | {r['layers']} | {peft:.3f} / {fused:.3f} | **{peft / fused:.2f}x** | "
                     f"{layer_peft:.1f} / {layer_fused:.1f} | {layer_peft / layer_fused:.2f}x |")
    lines += ["", "The loss is the same either way (to fp32 round-off: "
              + "; ".join(f"{r['losses']['peft']:.4f} vs {r['losses']['fused']:.4f}" for _, r in rows)
              + "); tests/training/test_families.py checks loss, gradients and merged weights on every "
              "family's model. PEFT's forward stays where the fused one cannot apply: ZeRO-3 (parameters "
              "gathered by each module's own forward hooks), DoRA, a bias on `lora_B`, quantised (QLoRA) layers."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return run_models(__doc__.splitlines()[0], SECTION, measure, render, argv)


if __name__ == "__main__":
    raise SystemExit(main())
