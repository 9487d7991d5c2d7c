"""LoRA adapters for serving tests: random, so that they change a model's answers, saved as PEFT
saves a job's artifact, or as a job's checkpoint holds one."""

from __future__ import annotations

from pathlib import Path


def random_adapter(base: str, out: Path, seed: int, rank: int = 8) -> Path:
    """A LoRA adapter of `base` on every linear layer with random A and B (B x3): its greedy
    replies differ from the base model's."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32),
                           LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear",
                                      init_lora_weights=False))
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.mul_(3)
    model.save_pretrained(out)
    return out


def as_checkpoint(adapter_dir: Path, out: Path) -> Path:
    """The adapter as a job's checkpoint holds it: the trainable weights by parameter name (the
    adapter named `default`) beside the adapter's config."""
    from safetensors.torch import load_file, save_file

    state = load_file(str(adapter_dir / "adapter_model.safetensors"))
    named = {k.replace(".lora_A.weight", ".lora_A.default.weight").replace(".lora_B.weight", ".lora_B.default.weight"): v
             for k, v in state.items()}
    (out / "adapter").mkdir(parents=True)
    save_file(named, str(out / "trainable.safetensors"))
    (out / "adapter" / "adapter_config.json").write_text((adapter_dir / "adapter_config.json").read_text())
    return out
