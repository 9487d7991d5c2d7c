"""What the cluster can hold, as the scheduling policy sees it: pools of worker slots.

Ray's nodes are grouped into pools of alike nodes: the same GPU type (or none) and the same
custom resources among those jobs may ask for (`EFT_ALLOWED_WORKER_RESOURCES`, e.g. `spot`). A
slot is one worker: a GPU on a GPU node, a CPU on a CPU node, capped by the node's count of each
custom resource (one `spot` unit per worker). A pool's slots are those free now plus those the
service's own running jobs hold (the policy plans them all), never more than its nodes have;
`EFT_NODE_GROUPS` adds the autoscaler's maximum per group, so a job whose minimum fits once a
group has grown is admitted and Ray's autoscaler adds the nodes. A job can use the pools whose
nodes have what each of its workers asks for (a GPU, its custom resources) and, for a GPU job,
whose GPUs have at least the memory the planner predicted per worker (by the GPU type Ray reports,
`GPU_MEMORY_GB`, `EFT_GPU_MEMORY_BY_TYPE`); once running, a GPU job stays on the GPU type it
started on (its workers are pinned to it: data-parallel ranks on mixed GPUs run at the slowest's pace).

`snapshot()` reads Ray (the service's replicas are Ray actors); the rest is pure and is what the
scheduler's tests drive with made-up nodes.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from eft.service.scheduling.policy import Demand, Pool
from eft.service.settings import Settings

log = logging.getLogger("eft.capacity")

STANDARD = frozenset({"CPU", "GPU", "memory", "object_store_memory"})

#: GB of memory of one GPU, by the accelerator type Ray reports for it (`accelerator_type:<type>`,
#: ray.util.accelerators). Where one name covers several sizes, the smallest: Ray reports every
#: A100 as `A100`, so an 80 GB one is `A100-80G` only when its nodes are labelled so, or when
#: `EFT_GPU_MEMORY_BY_TYPE` says `{"A100": 80}`.
GPU_MEMORY_GB: dict[str, float] = {
    "K80": 12, "P4": 8, "P100": 16, "V100": 16, "T4": 16, "A10G": 24, "L4": 24, "L40S": 48,
    "A100": 40, "A100-40G": 40, "A100-80G": 80, "H100": 80, "H20": 96, "H200": 141, "B200": 180,
    "GB200": 186, "B300": 288, "GB300": 288, "RTX-PRO-6000": 96, "AMD-Instinct-MI300X-OAM": 192,
}


@dataclass(frozen=True)
class Node:
    id: str
    total: Mapping[str, float]
    available: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Shape:
    """What one worker of a job needs, and how many workers it runs."""

    min_workers: int
    max_workers: int
    gpu: bool = False
    cpus: float = 1.0
    resources: Mapping[str, float] = field(default_factory=dict)
    #: The planner's predicted memory of one worker, GB (GPU jobs): GPUs with less do not qualify.
    memory_gb: float | None = None
    #: The GPU type a running job's workers are pinned to (`jobs.schedule`), if any.
    gpu_type: str | None = None

    def describe(self) -> str:
        needs = {"GPU": 1} if self.gpu else {"CPU": self.cpus}
        needs.update(self.resources)
        size = str(self.min_workers) if self.min_workers == self.max_workers else f"{self.min_workers}-{self.max_workers}"
        memory = f" with {self.memory_gb:.1f} GB" if self.gpu and self.memory_gb else ""
        return f"{size} worker(s) of {', '.join(f'{k}: {v:g}' for k, v in needs.items())}{memory}"


@dataclass
class Picture:
    """The pools, and which pools each kind of worker may use."""

    pools: dict[str, Pool]
    #: Each pool's slot kind: its GPU flag and the custom resources its nodes carry.
    kinds: dict[str, tuple[bool, frozenset[str]]]
    #: Slots free now (not counting what the service's jobs hold), and all the nodes' slots.
    free_now: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    #: Each GPU pool's GPU type and the memory of one of its GPUs, GB (None: not known).
    gpu_types: dict[str, str | None] = field(default_factory=dict)
    gpu_memory: dict[str, float | None] = field(default_factory=dict)

    def kind_fits(self, shape: Shape, name: str) -> bool:
        gpu, resources = self.kinds[name]
        return gpu == shape.gpu and set(shape.resources) <= resources

    def memory_fits(self, shape: Shape, name: str) -> bool:
        memory = self.gpu_memory.get(name)
        return not shape.gpu or shape.memory_gb is None or memory is None or memory >= shape.memory_gb

    def pools_for(self, shape: Shape) -> frozenset[str]:
        return frozenset(name for name in self.kinds
                         if self.kind_fits(shape, name) and self.memory_fits(shape, name)
                         and (shape.gpu_type is None or self.gpu_types.get(name) == shape.gpu_type))

    def gpu_type_of(self, placement: Mapping[str, int]) -> str | None:
        """The one GPU type of the pools in `placement`, if they are GPU pools of a known type."""
        types = {self.gpu_types.get(p) for p, n in placement.items() if n and self.kinds.get(p, (False,))[0]}
        return next(iter(types)) if len(types) == 1 and None not in types else None

    def ceiling(self, pools: Iterable[str]) -> int:
        return sum(self.pools[p].ceiling for p in pools)


def shape_of(config: Mapping[str, Any] | None, plan: Mapping[str, Any] | None = None,
             schedule: Mapping[str, Any] | None = None) -> Shape:
    """A validated job's worker shape, from its training config, its plan (the predicted memory
    per worker) and, once dispatched, its schedule (the GPU type it is pinned to)."""
    config = config or {}
    low = int(config.get("min_workers") or 1)
    memory = (plan or {}).get("predicted_memory_gb")
    return Shape(min_workers=low, max_workers=max(low, int(config.get("max_workers") or low)),
                 gpu=bool(config.get("use_gpu")), cpus=float(config.get("cpus_per_worker") or 1.0),
                 resources={k: float(v) for k, v in (config.get("resources_per_worker") or {}).items()},
                 memory_gb=float(memory) if memory else None, gpu_type=(schedule or {}).get("accelerator_type"))


def gpu_memory_gb(gpu_type: str | None, settings: Settings) -> float | None:
    """The memory of one GPU of `gpu_type`, GB: the operator's table over the built-in one."""
    if gpu_type is None:
        return None
    table = {**GPU_MEMORY_GB, **settings.gpu_memory_by_type}
    return float(table[gpu_type]) if gpu_type in table else None


def _kind(node: Node, custom: frozenset[str]) -> tuple[bool, frozenset[str]]:
    return node.total.get("GPU", 0) > 0, frozenset(r for r in node.total if r in custom and node.total[r] > 0)


def _slots(resources: Mapping[str, float], kind: tuple[bool, frozenset[str]]) -> int:
    gpu, custom = kind
    counts = [resources.get("GPU", 0.0) if gpu else resources.get("CPU", 0.0)]
    counts += [resources.get(r, 0.0) for r in custom]
    return max(0, int(math.floor(min(counts) + 1e-9)))


def _gpu_type(node: Node) -> str | None:
    # Ray marks a GPU node with its type as a resource (`accelerator_type:H100`); a node labelled
    # with a more precise size as well (`A100-80G` beside `A100`) goes by the longer name.
    types = sorted((r.split(":", 1)[1] for r in node.total if r.startswith("accelerator_type:")), key=lambda t: (-len(t), t))
    return types[0] if types and node.total.get("GPU", 0) > 0 else None


def _pool_name(kind: tuple[bool, frozenset[str]], gpu_type: str | None) -> str:
    gpu, custom = kind
    base = (gpu_type or "gpu") if gpu else "cpu"
    return "+".join([base, *sorted(custom)])


def pools(nodes: Iterable[Node], settings: Settings, held: Mapping[str, int] | None = None) -> Picture:
    """The pools of `nodes`; `held` is what the service's running jobs hold, per pool."""
    custom = frozenset(settings.allowed_worker_resources) | frozenset(settings.spot_resources)
    spot_marks = frozenset(settings.spot_resources)
    total: dict[str, int] = {}
    free: dict[str, int] = {}
    kinds: dict[str, tuple[bool, frozenset[str]]] = {}
    types: dict[str, str | None] = {}
    for node in nodes:
        kind = _kind(node, custom)
        gpu_type = _gpu_type(node)
        name = _pool_name(kind, gpu_type)
        kinds[name] = kind
        types[name] = gpu_type
        total[name] = total.get(name, 0) + _slots(node.total, kind)
        free[name] = free.get(name, 0) + _slots(node.available, kind)
    result: dict[str, Pool] = {}
    for name, kind in kinds.items():
        slots = min(total[name], free[name] + (held or {}).get(name, 0))
        result[name] = Pool(name, slots, spot=bool(kind[1] & spot_marks))
    for group, spec in settings.node_groups.items():
        kind = (spec.gpus_per_node > 0, frozenset(r for r in spec.resources if r in custom))
        gpu_type = spec.gpu_type if kind[0] else None
        name = next((n for n, k in kinds.items() if k == kind and (gpu_type is None or types.get(n) == gpu_type)), None)
        ceiling = spec.max_nodes * spec.slots_per_node
        if name is None:
            name = _pool_name(kind, gpu_type) if gpu_type else group
            kinds[name] = kind
            types[name] = gpu_type
            total[name] = 0
            free[name] = 0
            result[name] = Pool(name, 0, spot=spec.spot or bool(kind[1] & spot_marks), max_slots=ceiling)
        else:
            pool = result[name]
            result[name] = Pool(name, pool.slots, spot=pool.spot or spec.spot,
                                max_slots=(pool.max_slots or 0) + ceiling)
    memory = {name: gpu_memory_gb(types.get(name), settings) for name in kinds if kinds[name][0]}
    return Picture(result, kinds, free, total, {n: types.get(n) for n in kinds if kinds[n][0]}, memory)


def place_held(picture: Picture, running: Iterable[tuple[Shape, int]]) -> dict[str, int]:
    """Where the running jobs' workers are, per pool, as the policy places them: on-demand pools
    first. (Ray knows each worker's node; this is exact whenever a job fits one pool kind.)"""
    held: dict[str, int] = {}
    for shape, workers in running:
        left = workers
        for name in sorted(picture.pools_for(shape), key=lambda p: (picture.pools[p].spot, p)):
            room = max(picture.total.get(name, 0), picture.pools[name].ceiling) - held.get(name, 0)
            take = min(left, max(0, room))
            held[name] = held.get(name, 0) + take
            left -= take
            if not left:
                break
    return held


def snapshot(settings: Settings) -> list[Node] | None:
    """The cluster's alive nodes as Ray reports them now; None when this process is not
    connected to Ray (capacity unknown: dispatch by the job limits alone)."""
    try:
        import ray

        if not ray.is_initialized():
            return None
        # Per-node availability as Ray's own dashboard and autoscaler read it.
        from eft.training._ray import available_resources_per_node

        available = available_resources_per_node()
        return [Node(id=n["NodeID"], total=dict(n["Resources"]), available=dict(available.get(n["NodeID"], {})),
                     labels=dict(n.get("Labels") or {}))
                for n in ray.nodes() if n.get("Alive")]
    except Exception:  # noqa: BLE001 - Ray briefly unreachable: this pass dispatches by count
        log.warning("could not read the cluster's capacity", exc_info=True)
        return None


def demand(job_id: str, tenant: str, shape: Shape, picture: Picture, *, arrival: float, priority: int,
           workers: int = 0, speedup: tuple[float, ...] | None = None, remaining_s: float | None = None) -> Demand:
    return Demand(id=job_id, tenant=tenant, min_workers=shape.min_workers, max_workers=shape.max_workers,
                  arrival=arrival, priority=priority, workers=workers, speedup=speedup, remaining_s=remaining_s,
                  pools=picture.pools_for(shape))
