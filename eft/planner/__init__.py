"""The planner: predicted peak memory per GPU of each training configuration, and the fastest that fits.

Pure Python (no torch, ray or fastapi), so the CLI runs it on a laptop:

    from eft.planner import PlanSpec, known_architecture, plan

    spec = PlanSpec(known_architecture("llama-2-70b"), method="lora", seq_len=4096,
                    micro_batch=1, gpus=8, gpu_memory_gb=32)
    result = plan(spec)
    print(result.chosen.config.describe(), result.chosen.memory.total)

or from a shell: `eft plan --model llama-2-70b --method lora --gpus 8 --gpu-memory 32 --seq-len 4096`.

Modules: `architectures` (the closed registry, config.json loading, parameter counts), `spec`
(the question and the candidate configurations), `memory` (the three memory terms and their
formulas), `timing` (the relative-time heuristics), `planning` (`plan`, `nearest_fit`).
The model follows "A Study of Optimizations for Fine-tuning Large Language Models" (Singh et al.,
2024): its Table 1 and Figure 4 are the planner's tests (tests/unit/client/test_planner.py).
"""

from eft.planner.architectures import (
    KNOWN_ARCHITECTURES,
    Architecture,
    PlannerError,
    architecture_from_config,
    architecture_from_dict,
    known_architecture,
    with_parameters,
)
from eft.planner.memory import MemoryEstimate, estimate_memory
from eft.planner.planning import Candidate, Plan, Suggestion, nearest_fit, plan
from eft.planner.spec import (
    ATTENTIONS,
    METHODS,
    OFFLOADS,
    STRATEGIES,
    Configuration,
    Overheads,
    PlanSpec,
)
from eft.planner.timing import relative_time, supports_flash_attention

__all__ = [
    "ATTENTIONS",
    "KNOWN_ARCHITECTURES",
    "METHODS",
    "OFFLOADS",
    "STRATEGIES",
    "Architecture",
    "Candidate",
    "Configuration",
    "MemoryEstimate",
    "Overheads",
    "Plan",
    "PlanSpec",
    "PlannerError",
    "Suggestion",
    "architecture_from_config",
    "architecture_from_dict",
    "estimate_memory",
    "known_architecture",
    "nearest_fit",
    "plan",
    "relative_time",
    "supports_flash_attention",
    "with_parameters",
]
