"""Ray's nodes as the scheduling policy's pools of worker slots (pure: nodes made up here).

Run: .venv/bin/python -m pytest tests/unit/service/test_capacity.py -q
"""

from eft.service.scheduling.capacity import Node, Shape, place_held, pools, shape_of
from eft.service.settings import NodeGroup, Settings

SETTINGS = Settings(allowed_worker_resources=["spot", "ondemand"], spot_resources=["spot"])


def _node(i: int, total: dict, available: dict | None = None) -> Node:
    return Node(id=f"n{i}", total=total, available=total if available is None else available)


def test_nodes_group_by_gpu_type_and_custom_resources_and_spot_is_marked():
    nodes = [
        _node(0, {"CPU": 16, "GPU": 8, "accelerator_type:H100": 1, "spot": 8}),
        _node(1, {"CPU": 16, "GPU": 8, "accelerator_type:H100": 1, "spot": 8}, {"CPU": 4, "GPU": 2, "spot": 2}),
        _node(2, {"CPU": 16, "GPU": 4, "accelerator_type:A100": 1, "ondemand": 4}),
        _node(3, {"CPU": 8, "memory": 1e10, "node:10.0.0.3": 1}),  # a CPU node; per-node resources ignored
    ]
    picture = pools(nodes, SETTINGS)
    assert {n: (p.slots, p.spot) for n, p in picture.pools.items()} == {
        "H100+spot": (10, True), "A100+ondemand": (4, False), "cpu": (8, False)}
    # Slots held by the service's own jobs count (the policy plans them), never past the nodes'.
    held = pools(nodes, SETTINGS, {"H100+spot": 4})
    assert held.pools["H100+spot"].slots == 14
    assert pools(nodes, SETTINGS, {"H100+spot": 40}).pools["H100+spot"].slots == 16


def test_a_job_may_use_the_pools_whose_nodes_have_what_its_workers_ask_for():
    picture = pools([_node(0, {"CPU": 8, "GPU": 8, "spot": 8}), _node(1, {"CPU": 8, "GPU": 8}),
                     _node(2, {"CPU": 4, "spot": 1})], SETTINGS)
    assert picture.pools_for(Shape(1, 2, gpu=True, resources={"spot": 1})) == {"gpu+spot"}
    assert picture.pools_for(Shape(1, 2, gpu=True)) == {"gpu+spot", "gpu"}
    assert picture.pools_for(Shape(1, 1)) == {"cpu+spot"}
    assert picture.pools["cpu+spot"].slots == 1  # one spot unit: one worker
    assert picture.pools_for(Shape(1, 1, resources={"ondemand": 1})) == frozenset()


def test_the_autoscalers_groups_add_their_maximum_and_pools_with_no_node_yet():
    settings = SETTINGS.model_copy(update={"node_groups": {
        "h100-spot": NodeGroup(resources={"spot": 1}, gpus_per_node=8, slots_per_node=8, max_nodes=4, spot=True),
        "a100": NodeGroup(resources={"ondemand": 1}, gpus_per_node=4, slots_per_node=4, max_nodes=2),
    }})
    picture = pools([_node(0, {"CPU": 16, "GPU": 8, "spot": 8})], settings)
    assert picture.pools["gpu+spot"].slots == 8 and picture.pools["gpu+spot"].ceiling == 32
    assert picture.pools["a100"].slots == 0 and picture.pools["a100"].ceiling == 8
    assert picture.pools_for(Shape(2, 2, gpu=True, resources={"ondemand": 1})) == {"a100"}


def test_running_workers_are_placed_on_demand_first_and_shapes_come_from_the_config():
    picture = pools([_node(0, {"CPU": 2, "spot": 2}), _node(1, {"CPU": 3})], SETTINGS)
    held = place_held(picture, [(Shape(1, 4), 4), (Shape(1, 1, resources={"spot": 1}), 1)])
    assert held == {"cpu": 3, "cpu+spot": 2}
    shape = shape_of({"min_workers": 2, "max_workers": 4, "use_gpu": True, "resources_per_worker": {"spot": 1}})
    assert shape == Shape(2, 4, gpu=True, cpus=1.0, resources={"spot": 1.0})
    assert shape.describe() == "2-4 worker(s) of GPU: 1, spot: 1"
    assert shape_of(None) == Shape(1, 1)


def test_the_speedup_curve_is_fitted_to_the_throughput_measured_at_two_sizes():
    from eft.service.scheduling.policy import speedup_curve

    assert speedup_curve({2: 100.0}, 4) is None  # one size: nothing to fit
    linear = speedup_curve({1: 100.0, 2: 200.0}, 4)
    assert linear == (1.0, 2.0, 3.0, 4.0)
    poor = speedup_curve({1: 100.0, 4: 200.0}, 4)  # 4 workers at 2x: s = 1/3
    assert poor[3] == 2.0 and 1.4 < poor[1] < 1.6
    assert speedup_curve({1: 100.0, 2: 90.0}, 3) == (1.0, 1.0, 1.0)  # slower on more: no gain


def test_a_gpu_job_qualifies_only_for_gpu_types_with_its_planned_memory():
    nodes = [_node(0, {"CPU": 16, "GPU": 8, "accelerator_type:H100": 1}),
             _node(1, {"CPU": 16, "GPU": 4, "accelerator_type:A10G": 1}),
             _node(2, {"CPU": 16, "GPU": 4, "accelerator_type:A100": 1}),
             # Labelled with its size as well: the precise name wins.
             _node(3, {"CPU": 16, "GPU": 4, "accelerator_type:A100": 1, "accelerator_type:A100-80G": 1})]
    picture = pools(nodes, SETTINGS)
    assert set(picture.pools) == {"H100", "A10G", "A100", "A100-80G"}
    assert picture.gpu_memory == {"H100": 80, "A10G": 24, "A100": 40, "A100-80G": 80}
    big = shape_of({"use_gpu": True, "min_workers": 2}, plan={"predicted_memory_gb": 52.3})
    assert big.memory_gb == 52.3 and big.describe() == "2 worker(s) of GPU: 1 with 52.3 GB"
    assert picture.pools_for(big) == {"H100", "A100-80G"}
    assert picture.pools_for(shape_of({"use_gpu": True}, plan={"predicted_memory_gb": 20.0})) == set(picture.pools)
    # A CPU job's planned memory is host memory: GPU sizes do not apply.
    with_cpus = pools(nodes + [_node(5, {"CPU": 8})], SETTINGS)
    assert with_cpus.pools_for(shape_of({}, plan={"predicted_memory_gb": 500.0})) == {"cpu"}
    # The operator knows its A100s are the 80 GB ones; an unknown type is not held against a job.
    told = pools(nodes + [_node(4, {"CPU": 8, "GPU": 8, "accelerator_type:MYSTERY": 1})],
                 SETTINGS.model_copy(update={"gpu_memory_by_type": {"A100": 80}}))
    assert told.pools_for(big) == {"H100", "A100-80G", "A100", "MYSTERY"}
    # Once running, a job stays on the GPU type it was pinned to.
    pinned = shape_of({"use_gpu": True}, plan={"predicted_memory_gb": 52.3}, schedule={"accelerator_type": "H100"})
    assert picture.pools_for(pinned) == {"H100"}
    assert picture.gpu_type_of({"H100": 2}) == "H100" and picture.gpu_type_of({"H100": 1, "A100-80G": 1}) is None


def test_a_node_group_of_a_gpu_type_is_a_pool_of_that_type_before_its_nodes_exist():
    settings = SETTINGS.model_copy(update={"node_groups": {
        "h200": NodeGroup(gpus_per_node=8, slots_per_node=8, max_nodes=2, gpu_type="H200")}})
    picture = pools([_node(0, {"CPU": 16, "GPU": 4, "accelerator_type:L4": 1})], settings)
    assert picture.pools["H200"].slots == 0 and picture.pools["H200"].ceiling == 16
    assert picture.gpu_memory == {"L4": 24, "H200": 141}
    assert picture.pools_for(shape_of({"use_gpu": True}, plan={"predicted_memory_gb": 100.0})) == {"H200"}


def test_a_gpu_part_held_by_a_model_server_is_no_training_slot():
    """A model server replica on half a GPU (EFT_INFERENCE_GPUS=0.5) holds that GPU: training
    workers, a whole GPU each, are planned on the other GPUs only; CPU pools count its CPU."""
    node = _node(0, {"CPU": 16, "GPU": 8, "accelerator_type:H100": 1}, {"CPU": 15, "GPU": 7.5})
    picture = pools([node], SETTINGS)
    assert picture.free_now["H100"] == 7 and picture.pools["H100"].slots == 7
    cpu = pools([_node(1, {"CPU": 4}, {"CPU": 3})], SETTINGS)
    assert cpu.pools["cpu"].slots == 3
