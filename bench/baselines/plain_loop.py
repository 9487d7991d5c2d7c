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
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def plain_loop(config: dict[str, Any]) -> None:
    """`training.loop.train_loop_per_worker` with the per-step metrics kept in a list instead of
    sent to the job store's progress actor."""
    import torch

    from eft.training.config import TrainConfig
    from eft.training.loop import Recipe

    rows: list[dict[str, Any]] = config["rows"]

    class PlainRecipe(Recipe):
        def _publish(self, metrics: dict[str, float], wait: bool = False) -> None:
            rows.append({"step": self.step, "values": dict(metrics)})

    cfg = TrainConfig.from_dict(config["train"])
    torch.set_num_threads(max(1, int(cfg.cpus_per_worker)))
    recipe = PlainRecipe(cfg)
    recipe.setup()
    recipe.train()
    recipe.finish()


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
