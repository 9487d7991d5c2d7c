"""The loop's metrics rows are read off the device in batches (`training/loop.py:Recipe._sync`):
a row per step, the same values as reading every step, and a device read and collectives only
at the syncs (about once a second of training, checkpoints, evaluations, the end).

The product's loop runs in this process (Ray Train's local mode), on a real family's model
(Qwen2.5's tokenizer and chat template) and the bundled chat data.
"""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import ray.train.torch
from ray.train import RunConfig, ScalingConfig

from eft.training import loop
from eft.training.objectives import sft
from eft.training.config import LoraSpec, TrainConfig
from eft.training.errors import TrainingUserError
from devkit.families import model_name
from tests.helpers.paths import REPO

STEPS = 8
REDUCE, LOSS_SUM = loop._all_reduce_sum, sft.token_loss_sum


def _config(tmp_path: Path, **overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = dict(
        job_id="metrics-sync", model_path=str(REPO / "assets" / "models" / model_name("qwen2.5")),
        training_file=str(REPO / "assets" / "data" / "demo" / "chat_train.jsonl"), validation_file=None,
        method="lora", lora=LoraSpec(r=4, alpha=8), total_steps=STEPS, num_train_examples=64,
        global_batch_size=4, micro_batch_size=2, max_seq_len=128, checkpoint_every_steps=1000,
        checkpoint_root=str(tmp_path / "ckpt"),
    )
    return TrainConfig(**{**settings, **overrides}).to_dict()


def _train(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sync_s: float, poison_step: int | None = None,
           **overrides: Any) -> dict[str, Any]:
    """Train STEPS steps in this process; returns the published rows, the collectives (their
    sizes), and the checkpoint reports (step of the metrics they carry, reason)."""
    monkeypatch.setattr(loop, "SYNC_INTERVAL_S", sync_s)
    seen: dict[str, Any] = {"rows": [], "collectives": [], "reports": []}

    def counted(values: list[Any], device: Any, op: str = "sum") -> list[float]:
        seen["collectives"].append(len(values))
        return REDUCE(values, device, op)

    monkeypatch.setattr(loop, "_all_reduce_sum", counted)
    if poison_step is not None:
        monkeypatch.setattr(sft, "token_loss_sum", lambda model, batch: LOSS_SUM(model, batch) * (
            math.nan if recipe_of["r"].step == poison_step - 1 else 1.0))
    recipe_of: dict[str, Any] = {}

    def record(step: int, values: dict[str, float]) -> None:
        assert step == values["step"], f"row of step {values['step']} sent as step {step}"
        seen["rows"].append(dict(values))

    class Recorded(loop.Recipe):
        def _publish(self, metrics: dict[str, float], wait: bool = False) -> None:
            # The loop's own call, into a sink that keeps what `ProgressSink.record` is sent.
            self.sink = SimpleNamespace(record=SimpleNamespace(remote=record))
            try:
                super()._publish(metrics)
            finally:
                self.sink = None

        def _report(self, metrics: dict[str, float], with_checkpoint: bool, reason: str = "interval",
                    final: bool = False) -> None:
            seen["reports"].append((metrics["step"], reason))

    def train(config: dict[str, Any]) -> None:
        recipe = recipe_of["r"] = Recorded(loop.TrainConfig.from_dict(config["train"]))
        recipe.setup()
        recipe.train()

    ray.train.torch.TorchTrainer(
        train, train_loop_config={"train": _config(tmp_path, **overrides)},
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name="metrics-sync", storage_path=str(tmp_path / "ray")),
    ).fit()
    return seen


def test_rows_read_in_batches_equal_rows_read_every_step(tmp_path, monkeypatch):
    every_step = _train(tmp_path / "a", monkeypatch, sync_s=0.0)
    batched = _train(tmp_path / "b", monkeypatch, sync_s=1e9)
    # A row per step either way, in step order.
    assert [r["step"] for r in every_step["rows"]] == list(range(1, STEPS + 1))
    assert [r["step"] for r in batched["rows"]] == list(range(1, STEPS + 1))
    # The same values (the same seed, the same batches): reading late changes nothing.
    for one, other in zip(every_step["rows"], batched["rows"]):
        for name in ("loss", "grad_norm", "learning_rate", "epoch", "world_size"):
            assert one[name] == pytest.approx(other[name], rel=1e-6), (one["step"], name)
        assert one["tokens_per_s"] > 0 and other["tokens_per_s"] > 0
    # Read every step: two collectives per step. Batched: two at step 1 (the first loss shows
    # at once) and two at the end, the second carrying the maxima of the seven rows since.
    assert len(every_step["collectives"]) == 2 * STEPS
    assert len(batched["collectives"]) == 4
    assert batched["collectives"][-2] == 2 * (STEPS - 1)  # loss sum and input tokens per row
    assert batched["reports"] == every_step["reports"] == []


def test_a_checkpoint_step_syncs_and_its_report_carries_its_own_row(tmp_path, monkeypatch):
    seen = _train(tmp_path, monkeypatch, sync_s=1e9, checkpoint_every_steps=5)
    assert [r["step"] for r in seen["rows"]] == list(range(1, STEPS + 1))
    assert seen["reports"] == [(5, "interval")]
    assert len(seen["collectives"]) == 6  # step 1, the checkpoint at step 5, the end


def test_logging_every_few_steps_still_syncs_rows_in_order(tmp_path, monkeypatch):
    seen = _train(tmp_path, monkeypatch, sync_s=0.0, log_every_steps=3)
    # Rows at step 1, every third step and the last; a step's window covers the steps since the row before.
    assert [r["step"] for r in seen["rows"]] == [1, 3, 6, STEPS]
    assert all(r["step_time_s"] > 0 for r in seen["rows"])


def test_a_nan_loss_read_late_still_names_its_step(tmp_path, monkeypatch):
    with pytest.raises(Exception) as failure:
        _train(tmp_path, monkeypatch, sync_s=1e9, poison_step=3)
    error = failure.value
    while error is not None and not isinstance(error, TrainingUserError):
        error = error.__cause__ or error.__context__
    assert error is not None, failure.value
    assert error.code == "user_error.nan_loss" and "at step 3" in error.message
