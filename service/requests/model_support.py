"""What the service can do with a model directory, read from the model itself.

The architecture is built on the meta device (no memory, no weights read: a 70B model takes
~50 ms), which gives the exact facts a request is checked and planned against:

* the linear modules of a decoder layer, by name, shape and kind (attention or MLP): the LoRA
  target names a request may use are the model's own (`qkv_proj` on Phi-3, `c_attn` on GPT-2,
  `query_key_value` on GPT-NeoX), and the planner counts their real shapes;
* the exact parameter count (tied embeddings counted once);
* which attention kernels the architecture supports (Gemma 2 and Bloom refuse SDPA);
* whether packed examples stay independent (`eft.training.packing.packing_is_exact`);
* the text model inside a multimodal checkpoint's config (Gemma 3 4B and up);
* whether the checkpoint needs code from its repository, which the service does not run.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from eft.planner.architectures import LORA_PRESETS, Linear
from eft.service.errors import Problem, RequestInvalid
from eft.training.config import LoraSpec
from eft.training.packing import packing_is_exact

ATTENTION_WORDS = ("attn", "attention")
MLP_WORDS = ("mlp", "feed_forward", "ffn")


@dataclass(frozen=True)
class ModelSupport:
    model_type: str
    architecture: str
    linears: tuple[Linear, ...]
    parameters: int
    attentions: tuple[str, ...]
    packing: bool
    tied_embeddings: bool
    language_model: str | None = None
    """Module path of the text model inside a multimodal checkpoint (e.g.
    "model.language_model"); None for a text-only model."""

    @property
    def target_names(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(m.name for m in self.linears))

    def targets_for(self, preset: str) -> tuple[str, ...]:
        """Module names a LoRA preset stands for: "attention" or "attention+mlp"."""
        kinds = ("attention",) if preset == "attention" else ("attention", "mlp")
        return tuple(dict.fromkeys(m.name for m in self.linears if m.kind in kinds))

    def lora_targets(self, target: str | tuple[str, ...]) -> str | tuple[str, ...]:
        """The modules a request's `target_modules` stands for: presets become the model's own
        names; in a multimodal checkpoint "all-linear" becomes the text layers' names, which
        `module_scope` then confines to the text model."""
        if target in LORA_PRESETS:
            return self.targets_for(target)
        if target == "all-linear" and self.language_model is not None:
            return self.target_names
        return target

    def lora_spec(self, target: str | tuple[str, ...], **options: Any) -> LoraSpec:
        """A `LoraSpec` adapting `target` of this model (its text model only, if multimodal)."""
        return LoraSpec(target_modules=self.lora_targets(target), module_scope=self.language_model, **options)


def _refuse(code: str, message: str) -> RequestInvalid:
    return RequestInvalid(problems=[Problem("model", code, message)])


def _signature(path: Path) -> tuple[int, int]:
    st = (path / "config.json").stat()
    return st.st_size, st.st_mtime_ns


class ComputedOnce:
    """`fn(*key)` remembered per key (the `maxsize` most recent), computed by one thread at a
    time and read by any without a lock.

    Request handlers run on many threads. Concurrent first calls would import the same
    transformers modules from several threads at once, which transformers' lazy module does
    not support (`getattr(transformers, "LlamaForCausalLM")` raised AttributeError in a thread
    while another was importing it), so computing takes a lock. Reading does not: under 50
    concurrent creates, threads queued on a lock held for a dictionary lookup (its holder waits
    for the interpreter like every other thread) and every request waited behind them.
    Exceptions are not remembered."""

    def __init__(self, fn: Callable[..., Any], maxsize: int):
        self._fn, self._maxsize = fn, maxsize
        self._values: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()

    def __call__(self, *key: Any) -> Any:
        try:
            return self._values[key]
        except KeyError:
            pass
        with self._lock:
            if key not in self._values:
                value = self._fn(*key)
                while len(self._values) >= self._maxsize:
                    self._values.pop(next(iter(self._values)))
                self._values[key] = value
            return self._values[key]


def inspect_model(model_path: str) -> ModelSupport:
    """The support facts of a local model directory. Raises RequestInvalid (param "model")."""
    path = Path(model_path)
    return _inspected(str(path.resolve()), _signature(path))


def _kind(path: str) -> str:
    parts = path.lower().split(".")[:-1]
    if any(w in p for p in parts for w in ATTENTION_WORDS):
        return "attention"
    if any(w in p for p in parts for w in MLP_WORDS):
        return "mlp"
    return "other"


def _decoder_layer(model: Any, layers: int) -> Any:
    import torch

    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == layers:
            return module[0]
    raise _refuse("architecture_unsupported", f"{type(model).__name__}: no stack of {layers} decoder "
                  "layers found: this architecture is not supported for fine-tuning")


def _layer_linears(layer: Any) -> tuple[Linear, ...]:
    import torch

    out = []
    for name, module in layer.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, torch.nn.Linear):
            out.append(Linear(name.split(".")[-1], module.in_features, module.out_features, _kind(name)))
        elif type(module).__name__ == "Conv1D" and weight is not None:  # GPT-2's transposed linear
            out.append(Linear(name.split(".")[-1], weight.shape[0], weight.shape[1], _kind(name)))
    return tuple(out)


def _inspect(model_path: str, _signature: tuple[int, int]) -> ModelSupport:
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    raw = json.loads((Path(model_path) / "config.json").read_text())
    model_type = raw.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        remote = " It ships its own modelling code (auto_map), which this service does not run " \
                 "(trust_remote_code is off)." if raw.get("auto_map") else ""
        raise _refuse("architecture_unsupported",
                      f"model_type {model_type!r} is not an architecture transformers "
                      f"{transformers.__version__} knows.{remote} Use a checkpoint of a supported "
                      "architecture, or a transformers release that has this one")
    try:
        config = AutoConfig.from_pretrained(model_path)
    except Exception as exc:  # noqa: BLE001 - any unreadable config is the request's problem
        raise _refuse("model_config_invalid", f"cannot read the model's config.json: {exc}") from None
    class_name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if class_name is None:
        raise _refuse("architecture_unsupported",
                      f"{config.model_type!r} has no causal language model class in transformers: "
                      "only decoder (causal LM) checkpoints can be fine-tuned here")
    model_class = getattr(transformers, class_name)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    root, language_model = model, None
    if text is not config:  # multimodal: the decoder layers are the text model's
        root = model.get_decoder()
        language_model = next(name for name, module in model.named_modules() if module is root)
    layer = _decoder_layer(root, text.num_hidden_layers)
    attentions = ["eager"]
    if getattr(model_class, "_supports_sdpa", False):
        attentions.append("sdpa")
    if getattr(model_class, "_supports_flash_attn", False) or getattr(model_class, "_supports_flash_attn_2", False):
        attentions.append("flash_attention_2")
    unique = {id(p): p.numel() for p in model.parameters()}
    tied = bool(getattr(text, "tie_word_embeddings", False) or getattr(config, "tie_word_embeddings", False))
    return ModelSupport(
        model_type=config.model_type, architecture=class_name, linears=_layer_linears(layer),
        parameters=sum(unique.values()), attentions=tuple(attentions),
        packing=packing_is_exact(getattr(text, "model_type", config.model_type)), tied_embeddings=tied,
        language_model=language_model,
    )


def _inspect_outcome(model_path: str, signature: tuple[int, int]) -> tuple[str, Any]:
    """`_inspect` as a picklable outcome: ("ok", facts) or ("refused", problems)."""
    try:
        return "ok", _inspect(model_path, signature)
    except RequestInvalid as exc:
        return "refused", exc.problems


def _inspect_isolated(model_path: str, signature: tuple[int, int]) -> ModelSupport:
    """`_inspect` in the replica's model helper (service/isolation.py): building a model on the
    meta device needs torch and transformers, which the API's process never imports (their
    million objects would make each of its full garbage collections a pause of 100-200 ms)."""
    from eft.service import isolation
    kind, value = isolation.run(_inspect_outcome, model_path, signature, pool="model", param="model")
    if kind == "refused":
        raise RequestInvalid(problems=value)
    return value


_inspected = ComputedOnce(_inspect_isolated, maxsize=32)
