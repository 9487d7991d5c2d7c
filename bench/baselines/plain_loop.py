"""The product's own training loop as a plain single-process script: no service, no Ray Job,
no Ray Train worker group (Ray Train's local mode runs the loop in this process).

Run from the repository root with a job's training config (the `config` the service stored):

    .venv/bin/python bench/baselines/plain_loop.py --config cfg.json --out metrics.json

Metrics that the loop sends to the job store in the service are collected here in a list and
written to `--out`, so `bench/speed.py` computes tokens/s the same way for both.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def run_recipe(train: dict[str, Any], publish: Callable[[Any, dict[str, float]], None], finish: bool = True,
               after_step: Callable[[], None] | None = None) -> Any:
    """`training.loop.train_loop_per_worker` on the TrainConfig dict `train`, each metrics row
    handed to `publish(recipe, metrics)` instead of the job store's progress actor (rows come
    at the loop's syncs, several at once: a row's step is `metrics["step"]`), and
    `after_step()` called after every optimizer step. Returns the recipe (its rank, its step)."""
    import torch

    from eft.training.config import TrainConfig
    from eft.training.loop import Recipe

    class Published(Recipe):
        def _publish(self, metrics: dict[str, float], wait: bool = False) -> None:
            publish(self, metrics)

        def train_step(self, window: Any) -> Any:
            grad_norm = super().train_step(window)
            if after_step is not None:
                after_step()
            return grad_norm

    cfg = TrainConfig.from_dict(train)
    torch.set_num_threads(max(1, int(cfg.cpus_per_worker)))
    recipe = Published(cfg)
    recipe.setup()
    recipe.train()
    if finish:
        recipe.finish()
    return recipe


def plain_loop(config: dict[str, Any]) -> None:
    """The loop with the per-step metrics kept in a list."""
    rows: list[dict[str, Any]] = config["rows"]
    run_recipe(config["train"], lambda recipe, metrics: rows.append({"step": int(metrics["step"]), "values": dict(metrics)}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import ray.train.torch
    from ray.train import RunConfig, ScalingConfig

    cfg = json.loads(Path(args.config).read_text())
    cfg["checkpoint_root"] = tempfile.mkdtemp(prefix="eft-plain-")
    rows: list[dict[str, Any]] = []
    trainer = ray.train.torch.TorchTrainer(
        plain_loop, train_loop_config={"train": cfg, "rows": rows},
        # num_workers=0: Ray Train's local mode, the loop runs in this process.
        scaling_config=ScalingConfig(num_workers=0),
        run_config=RunConfig(name=cfg["job_id"], storage_path=cfg["checkpoint_root"]),
    )
    trainer.fit()
    Path(args.out).write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
