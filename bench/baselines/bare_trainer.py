"""What a user without the service would run to start the same training: a bare `TorchTrainer`
script against the running cluster, with the product's worker loop and the job's stored config.

Run from the repository root, with a Ray cluster up (`ray.init(address="auto")` joins it):

    .venv/bin/python bench/baselines/bare_trainer.py --config cfg.json --out first_step.json

It writes the wall-clock time (time.time()) at which rank 0 finished its first optimizer step;
`bench/speed.py` sets it against the time it launched this script, the bare counterpart of
`POST /jobs` -> first step (interpreter, imports, Ray Train's controller and worker group,
model load and the first step, with no service, Ray Job, progress reporting or checkpoints).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def bare_loop(config: dict[str, Any]) -> None:
    """The product's worker loop, whose first metrics report stamps the time."""
    from bench.baselines.plain_loop import run_recipe

    out = Path(config["out"])

    def stamp(recipe: Any, metrics: dict[str, float]) -> None:
        if recipe.rank == 0 and metrics["step"] == 1:  # the first row comes at once, after step 1
            out.write_text(json.dumps({"first_step_at": time.time()}))

    run_recipe(config["train"], stamp, finish=False)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    import ray
    import ray.train.torch
    from ray.train import RunConfig, ScalingConfig

    cfg = json.loads(Path(args.config).read_text())
    cfg["checkpoint_root"] = tempfile.mkdtemp(prefix="eft-bare-")
    # The workers import bench/ (the loop's wrapper) from the repository.
    ray.init(address="auto", log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}})
    trainer = ray.train.torch.TorchTrainer(
        bare_loop, train_loop_config={"train": cfg, "out": args.out},
        scaling_config=ScalingConfig(num_workers=cfg["min_workers"], resources_per_worker={"CPU": cfg["cpus_per_worker"]}),
        run_config=RunConfig(name=f"bare-{cfg['job_id']}-{time.time_ns()}", storage_path=cfg["checkpoint_root"]),
    )
    trainer.fit()


if __name__ == "__main__":
    main()
