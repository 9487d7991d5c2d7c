"""Where a job's Ray Train workers go: the resources each asks Ray for (training/driver.py)."""

from eft.training import driver
from eft.training.config import TrainConfig


def _config(**changes) -> TrainConfig:
    return TrainConfig(job_id="j", model_path="m", training_file="t", validation_file=None, method="lora", lora=None,
                       total_steps=10, num_train_examples=10, **changes)


def test_a_gpu_job_pinned_to_a_gpu_type_asks_ray_for_that_type(tmp_path):
    pinned = driver.build_trainer(_config(use_gpu=True, accelerator_type="H100", checkpoint_root=str(tmp_path),
                                          resources_per_worker={"spot": 1.0}), [], None).scaling_config
    # Ray's own constraint: a sliver of the node's `accelerator_type:H100` resource per worker.
    assert pinned._resources_per_worker_not_none == {"CPU": 1.0, "GPU": 1, "spot": 1.0, "accelerator_type:H100": 0.001}
    anywhere = driver.build_trainer(_config(use_gpu=True, checkpoint_root=str(tmp_path)), [], None).scaling_config
    assert not any(k.startswith("accelerator_type:") for k in anywhere._resources_per_worker_not_none)
    # A CPU job has no GPU type to keep to, whatever its schedule says.
    cpu = driver.build_trainer(_config(accelerator_type="H100", checkpoint_root=str(tmp_path)), [], None).scaling_config
    assert cpu._resources_per_worker_not_none == {"CPU": 1.0}
