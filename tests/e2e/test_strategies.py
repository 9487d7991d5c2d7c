"""Every strategy trains the same model: for one seed, data and global batch, the LoRA weights
after N steps under FSDP2 agree with DDP's, and the loss falls under each. Real Ray Train
workers (2, gloo on CPU), the bundled tiny Llama, fp32.

Tolerance: in fp32 on CPU the strategies differ only in the order of floating-point
reductions (all-reduce vs reduce-scatter vs ZeRO's bucketed reduce), ~1e-7 relative per
gradient. Adam divides each gradient by its running RMS, so for an element whose gradient is
near zero that round-off can move the update by a visible fraction of one step (lr = 3e-3).
Packed micro-batches (whole examples laid end to end) change the summation order once more,
and one element in a thousand has been seen 1.6% of a 6-step budget away under ZeRO-2.
Hence three bounds: no element beyond 5% of the most an element can move in 6 steps
(lr x 6 = 1.8e-2, so 9e-4), fewer than 1% of elements beyond 1e-4, and the mean absolute
difference over all weights below 1e-6. A skipped micro-batch, a wrong per-rank weighting or a
wrong learning rate moves most elements by ~1e-3 and fails the last two.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import ray
import torch
from ray.train import CheckpointConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from safetensors.torch import load_file

from eft.training.config import LoraSpec, TrainConfig
from eft.training.loop import train_loop_per_worker

pytestmark = pytest.mark.e2e
REPO = Path(__file__).resolve().parents[2]
STEPS = 6
LEARNING_RATE = 3e-3


@ray.remote(num_cpus=0)
class Collector:
    def __init__(self):
        self.rows = []

    def record(self, step, values):
        self.rows.append((step, dict(values)))
        return step

    def resumed(self, step, world_size, reason, load_seconds=0.0):
        self.rows.append((step, {"resumed_world_size": world_size, "checkpoint_reason": reason}))
        return 0

    def get(self):
        return self.rows


def _config(strategy: str, root: Path) -> TrainConfig:
    return TrainConfig(
        job_id=f"strategy-{strategy}", model_path=str(REPO / "assets/models/tiny-llama"),
        training_file=str(REPO / "assets/data/demo/chat_train.jsonl"),
        validation_file=str(REPO / "assets/data/demo/chat_valid.jsonl"),
        method="lora", lora=LoraSpec(r=8, alpha=16, dropout=0.0), total_steps=STEPS,
        # A constant rate, so a run cut short and resumed is the same optimisation.
        num_train_examples=1600, learning_rate=LEARNING_RATE, lr_scheduler="constant", global_batch_size=10,
        micro_batch_size=2, max_seq_len=96, seed=7, min_workers=2, max_workers=2,
        strategy=strategy, checkpoint_every_steps=100, checkpoint_root=str(root),
    )


def _train(strategy: str, root: Path, workers: int = 2, **overrides) -> tuple[dict[str, torch.Tensor], list, dict]:
    cfg = dataclasses.replace(_config(strategy, root), min_workers=workers, max_workers=workers, **overrides)
    collector = Collector.remote()
    result = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"train": cfg.to_dict(), "progress": collector},
        scaling_config=ScalingConfig(num_workers=workers),
        run_config=RunConfig(name=cfg.job_id, storage_path=str(root),
                             checkpoint_config=CheckpointConfig(num_to_keep=1)),
    ).fit()
    with result.checkpoint.as_directory() as d:
        weights = load_file(str(Path(d) / "trainable.safetensors"))
        saved = {p.name for p in (Path(d) / "adapter").iterdir()}
        assert "adapter_model.safetensors" in saved or "model.safetensors" in saved  # full: a model
    return weights, ray.get(collector.get.remote()), result.metrics


@pytest.fixture(scope="module")
def trained(ray_cluster, tmp_path_factory):
    """Train each strategy once per module; tests share the runs."""
    runs: dict[str, tuple] = {}

    def get(strategy: str) -> tuple:
        if strategy not in runs:
            runs[strategy] = _train(strategy, tmp_path_factory.mktemp(strategy))
        return runs[strategy]

    return get


STRATEGIES = ["fsdp", "zero1", "zero2", "zero3"]


@pytest.mark.parametrize("strategy", ["ddp", *STRATEGIES])
def test_loss_falls(strategy, trained):
    weights, rows, final = trained(strategy)
    losses = [v["loss"] for _, v in rows if "loss" in v]
    assert len(losses) == STEPS and losses[-1] < losses[0]
    assert all(v["world_size"] == 2 for _, v in rows)
    assert final["eval_loss"] < 5.0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_strategy_matches_ddp(strategy, trained):
    ref_weights, ref_rows, _ = trained("ddp")
    weights, rows, _ = trained(strategy)
    assert set(weights) == set(ref_weights) and len(weights) > 0
    diffs = torch.cat([(weights[n] - t).abs().flatten() for n, t in ref_weights.items()])
    assert float(diffs.max()) < 0.05 * LEARNING_RATE * STEPS
    assert float((diffs > 1e-4).double().mean()) < 0.01
    assert float(diffs.mean()) < 1e-6
    ref_losses = [v["loss"] for _, v in ref_rows if "loss" in v]
    losses = [v["loss"] for _, v in rows if "loss" in v]
    assert losses == pytest.approx(ref_losses, rel=1e-5)


OPTIONS = {
    "ddp-gradient-checkpointing": ("ddp", {"gradient_checkpointing": True}),
    "ddp-bf16": ("ddp", {"precision": "bf16"}),
    "ddp-fp16-loss-scaling": ("ddp", {"precision": "fp16"}),
    "ddp-eager-attention": ("ddp", {"attention": "eager"}),
    "fsdp-bf16-offload": ("fsdp", {"precision": "bf16", "offload": "optimizer+params"}),
    "zero2-offload-optimizer": ("zero2", {"offload": "optimizer"}),
    "zero3-offload-params-checkpointing": ("zero3", {"offload": "optimizer+params", "gradient_checkpointing": True}),
    "zero2-bf16": ("zero2", {"precision": "bf16"}),
    "qlora-8bit": ("ddp", {"method": "qlora", "lora": LoraSpec(r=8, alpha=16, dropout=0.0, quant_bits=8)}),
    "qlora-4bit-fp4-checkpointing": ("ddp", {"method": "qlora", "gradient_checkpointing": True,
                                             "lora": LoraSpec(r=8, alpha=16, dropout=0.0, quant_type="fp4")}),
    "full-fine-tuning": ("ddp", {"method": "full", "lora": None, "learning_rate": 1e-3}),
}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_each_option_trains(name, ray_cluster, tmp_path):
    strategy, overrides = OPTIONS[name]
    weights, rows, final = _train(strategy, tmp_path, **overrides)
    losses = [v["loss"] for _, v in rows if "loss" in v]
    assert len(losses) == STEPS and all(map(lambda x: x == x, losses))  # no NaN
    assert losses[-1] < losses[0], losses
    assert final["peak_memory_gb"] > 0.05 and final["peak_memory_gb_rank1"] > 0.05
    assert weights


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero2", "zero3"])
def test_resume_from_checkpoint_continues_the_same_run(strategy, trained, tmp_path):
    """Stop after 3 steps, start again under the same run name: Ray resumes from the
    checkpoint, and the result matches the uninterrupted run."""
    whole, whole_rows, _ = trained(strategy)
    _train(strategy, tmp_path, total_steps=3)
    resumed, resumed_rows, _ = _train(strategy, tmp_path)
    assert [s for s, v in resumed_rows if "loss" in v] == [4, 5, 6]  # steps 1-3 not redone
    for name, tensor in whole.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-3, atol=1e-4)
    whole_losses = {s: v["loss"] for s, v in whole_rows if "loss" in v}
    assert [v["loss"] for s, v in resumed_rows if "loss" in v] == pytest.approx(
        [whole_losses[s] for s in (4, 5, 6)], rel=1e-5)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero2", "zero3"])
def test_resume_at_another_world_size(strategy, trained, tmp_path):
    """Stop after 3 steps on 2 workers, resume on 1: the checkpoint holds consolidated
    trainable and optimizer state, so the result still matches the uninterrupted 2-worker run."""
    whole, whole_rows, _ = trained(strategy)
    _train(strategy, tmp_path, total_steps=3)
    resumed, resumed_rows, final = _train(strategy, tmp_path, workers=1)
    assert (3, {"resumed_world_size": 1, "checkpoint_reason": "final"}) in resumed_rows
    assert [s for s, v in resumed_rows if "loss" in v] == [4, 5, 6]
    assert final["world_size"] == 1
    for name, tensor in whole.items():
        torch.testing.assert_close(resumed[name], tensor, rtol=1e-3, atol=1e-4)
    whole_losses = {s: v["loss"] for s, v in whole_rows if "loss" in v}
    assert [v["loss"] for s, v in resumed_rows if "loss" in v] == pytest.approx(
        [whole_losses[s] for s in (4, 5, 6)], rel=1e-4)
