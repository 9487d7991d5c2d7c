"""Model architectures the planner knows, how to read one from a `config.json`, and what it counts.

Parameter counts follow the Hugging Face modules, biases ignored (none of the registered models
has any):
- per decoder layer, attention: q `h x a*d`, k and v `h x kv*d`, o `a*d x h` (Falcon fuses q, k, v
  into one `query_key_value` of `h x (a + 2*kv)*d`), where d is the head dimension;
- per decoder layer, MLP: `gate_proj`, `up_proj`, `down_proj` (3*h*i) for gated SwiGLU models,
  `dense_h_to_4h`, `dense_4h_to_h` (2*h*i) otherwise;
- norms: RMSNorm has h weights, LayerNorm h weights and h biases; two per layer and a final one;
- the token embedding `V x h`, and an LM head `V x h` unless the embeddings are tied.

With these rules Llama 2 7B has 6.74e9 parameters and LoRA with r = 64 on `q_proj`, `v_proj` trains
33.6e6 of them (the study's "roughly 33.6 million"); Llama 2 70B: 69.0e9 and 131e6 ("about 131
million ... ~0.19%").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any


class PlannerError(ValueError):
    """A planning input the planner cannot use. `param` names the offending field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Linear:
    """One linear module of a decoder layer: its suffix name and shape."""

    name: str
    in_features: int
    out_features: int
    kind: str = ""
    """"attention" or "mlp" (what LoRA presets select by)."""

    @property
    def parameters(self) -> int:
        return self.in_features * self.out_features


@dataclass(frozen=True)
class Architecture:
    """The numbers of a decoder-only transformer the memory model needs."""

    name: str
    hidden_size: int
    """h: width of the residual stream."""
    num_layers: int
    """L: decoder layers."""
    num_heads: int
    """a: attention (query) heads."""
    num_kv_heads: int
    """Key/value heads (grouped-query attention); equals `num_heads` for multi-head attention."""
    intermediate_size: int
    """i: inner width of the MLP."""
    vocab_size: int
    """V: rows of the embedding and of the LM head."""
    head_dim: int | None = None
    """d: defaults to h / a."""
    gated_mlp: bool = True
    """SwiGLU (gate, up, down) as in Llama/Mistral; False for Falcon's up/down MLP."""
    fused_qkv: bool = False
    """One `query_key_value` projection (Falcon) instead of q_proj, k_proj, v_proj."""
    layer_norm: bool = False
    """LayerNorm (weight and bias) instead of RMSNorm (weight only)."""
    tie_word_embeddings: bool = False
    num_parameters: int | None = None
    """Override of the counted total, e.g. the study's nominal 7e9 for Llama 2 7B in Table 1."""
    linears: tuple[Linear, ...] | None = None
    """A decoder layer's linear modules as the model itself has them (read off the model by the
    service); None derives them from the numbers above, named as Llama (or Falcon) names them."""

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_layers", "num_heads", "num_kv_heads",
                      "intermediate_size", "vocab_size"):
            if getattr(self, field) < 1:
                raise PlannerError(f"{field} must be at least 1, got {getattr(self, field)}", field)
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise PlannerError(f"hidden_size ({self.hidden_size}) is not a multiple of num_heads "
                               f"({self.num_heads}): give head_dim", "head_dim")
        if self.num_heads % self.num_kv_heads:
            raise PlannerError(f"num_heads ({self.num_heads}) is not a multiple of num_kv_heads "
                               f"({self.num_kv_heads})", "num_kv_heads")

    @property
    def resolved_head_dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_heads

    def layer_linears(self) -> tuple[Linear, ...]:
        """The linear modules of one decoder layer, named as in Hugging Face transformers."""
        if self.linears is not None:
            return self.linears
        h, i, d = self.hidden_size, self.intermediate_size, self.resolved_head_dim
        q_out, kv_out = self.num_heads * d, self.num_kv_heads * d
        if self.fused_qkv:
            attention = (Linear("query_key_value", h, q_out + 2 * kv_out, "attention"),
                         Linear("dense", q_out, h, "attention"))
        else:
            attention = (Linear("q_proj", h, q_out, "attention"), Linear("k_proj", h, kv_out, "attention"),
                         Linear("v_proj", h, kv_out, "attention"), Linear("o_proj", q_out, h, "attention"))
        if self.gated_mlp:
            mlp = (Linear("gate_proj", h, i, "mlp"), Linear("up_proj", h, i, "mlp"), Linear("down_proj", i, h, "mlp"))
        else:
            mlp = (Linear("dense_h_to_4h", h, i, "mlp"), Linear("dense_4h_to_h", i, h, "mlp"))
        return attention + mlp

    @property
    def _norm_parameters(self) -> int:
        return self.hidden_size * (2 if self.layer_norm else 1)

    @property
    def layer_parameters(self) -> int:
        """Parameters of one decoder layer (linears and its two norms)."""
        return sum(m.parameters for m in self.layer_linears()) + 2 * self._norm_parameters

    @property
    def embedding_parameters(self) -> int:
        """Token embedding plus the LM head when it is not tied to it."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)

    @property
    def counted_parameters(self) -> int:
        layers = self.num_layers * self.layer_parameters
        return layers + self.embedding_parameters + self._norm_parameters

    @property
    def parameters(self) -> int:
        """θ: total parameters, `num_parameters` when given, else counted."""
        return self.num_parameters or self.counted_parameters

    @property
    def linear_fraction(self) -> float:
        """Share of the parameters in decoder-layer linears: what QLoRA stores in 4 bits."""
        linear = self.num_layers * sum(m.parameters for m in self.layer_linears())
        return linear / self.counted_parameters

    @property
    def largest_module_parameters(self) -> int:
        """The largest single weight (a layer linear or the embedding/LM head): what ZeRO-3
        gathers at once, and what QLoRA dequantizes at once."""
        return max(max(m.parameters for m in self.layer_linears()), self.vocab_size * self.hidden_size)

    def adapted_linears(self, targets: str | tuple[str, ...]) -> tuple[Linear, ...]:
        """The linears of one layer that LoRA adapts for `targets` (see `lora_parameters`).
        Raises PlannerError for a name this architecture does not have."""
        modules = self.layer_linears()
        if targets in LORA_PRESETS:
            kinds = ("attention",) if targets == "attention" else ("attention", "mlp")
            return tuple(m for m in modules if m.kind in kinds)
        if targets == "all-linear":
            return modules
        known = {m.name for m in modules}
        unknown = sorted(set(targets) - known)
        if unknown:
            names = ", ".join(dict.fromkeys(m.name for m in modules))
            raise PlannerError(f"{self.name} has no module {', '.join(unknown)}: use all-linear, "
                               f"attention, attention+mlp, or some of {names}", "lora_targets")
        return tuple(m for m in modules if m.name in targets)

    def lora_parameters(self, r: int, targets: str | tuple[str, ...]) -> int:
        """Trainable LoRA parameters: r * (in + out) per adapted linear, over every layer.

        `targets` is "all-linear" (every decoder-layer linear, as PEFT does; the LM head is left
        out), a preset ("attention": the attention projections; "attention+mlp": those and the
        MLP's), or module names such as ("q_proj", "v_proj"). Raises PlannerError for a name
        this architecture does not have.
        """
        return self.num_layers * sum(r * (m.in_features + m.out_features)
                                     for m in self.adapted_linears(targets))

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "parameters": self.parameters, "hidden_size": self.hidden_size,
                "num_layers": self.num_layers, "num_heads": self.num_heads,
                "num_kv_heads": self.num_kv_heads, "vocab_size": self.vocab_size}


def _llama(name: str, h: int, layers: int, heads: int, kv: int, inter: int, vocab: int) -> Architecture:
    return Architecture(name, h, layers, heads, kv, inter, vocab)


#: The closed registry: names a request may use without a config.json (numbers from each model's
#: published config.json). Falcon 180B is the study's largest model.
KNOWN_ARCHITECTURES: Mapping[str, Architecture] = {
    a.name: a for a in (
        _llama("llama-2-7b", 4096, 32, 32, 32, 11008, 32000),
        _llama("llama-2-13b", 5120, 40, 40, 40, 13824, 32000),
        _llama("llama-2-70b", 8192, 80, 64, 8, 28672, 32000),
        _llama("llama-3-8b", 4096, 32, 32, 8, 14336, 128256),
        _llama("llama-3-70b", 8192, 80, 64, 8, 28672, 128256),
        _llama("mistral-7b", 4096, 32, 32, 8, 14336, 32000),
        Architecture("falcon-180b", 14848, 80, 232, 8, 4 * 14848, 65024, gated_mlp=False,
                     fused_qkv=True, layer_norm=True, tie_word_embeddings=True),
    )
}


#: LoRA target presets besides "all-linear", resolved against a model's own module names.
LORA_PRESETS = ("attention", "attention+mlp")


def known_architecture(name: str) -> Architecture | None:
    """The registered architecture called `name` (case-insensitive), or None."""
    return KNOWN_ARCHITECTURES.get(name.strip().lower())


# config.json keys of the numbers, in the order they are tried (Llama/Mistral first, then Falcon
# and GPT-2 spellings).
_KEYS = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_heads": ("num_attention_heads", "n_head"),
    "vocab_size": ("vocab_size",),
}
_NON_GATED = {"falcon", "gpt2", "gpt_neox", "gptj", "opt", "bloom", "phi"}


def _first(config: Mapping[str, Any], keys: tuple[str, ...]) -> Any:
    return next((config[k] for k in keys if isinstance(config.get(k), int)), None)


def architecture_from_dict(config: Mapping[str, Any], name: str) -> Architecture:
    """The architecture a Hugging Face config describes (the text model's, for a multimodal
    checkpoint whose numbers sit in `text_config`). Raises PlannerError naming a missing key."""
    if _first(config, _KEYS["hidden_size"]) is None and isinstance(config.get("text_config"), Mapping):
        text = dict(config["text_config"])
        text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", False))
        return architecture_from_dict(text, name)
    found = {field: _first(config, keys) for field, keys in _KEYS.items()}
    missing = [_KEYS[f][0] for f, v in found.items() if v is None]
    if missing:
        raise PlannerError(f"config.json of {name} lacks {', '.join(missing)}: the planner needs "
                           "hidden_size, num_hidden_layers, num_attention_heads and vocab_size", "model")
    h, heads = found["hidden_size"], found["num_heads"]
    model_type = str(config.get("model_type", "")).lower()
    kv = _first(config, ("num_key_value_heads", "num_kv_heads"))
    if kv is None:
        kv = 1 if config.get("multi_query") and not config.get("new_decoder_architecture") else heads
    inter = _first(config, ("intermediate_size", "ffn_hidden_size", "n_inner")) or 4 * h
    return Architecture(
        name=name, hidden_size=h, num_layers=found["num_layers"], num_heads=heads,
        num_kv_heads=kv, intermediate_size=inter, vocab_size=found["vocab_size"],
        head_dim=config.get("head_dim") if isinstance(config.get("head_dim"), int) else None,
        gated_mlp=model_type not in _NON_GATED, fused_qkv=model_type == "falcon",
        layer_norm=model_type in _NON_GATED,
        tie_word_embeddings=bool(config.get("tie_word_embeddings", model_type in _NON_GATED)),
    )


def architecture_from_config(path: Path | str, name: str | None = None) -> Architecture:
    """Read the architecture from `path`: a `config.json` file or a model directory holding one.

    Raises PlannerError (param "model") when there is no readable config.json or it lacks a number.
    """
    path = Path(path)
    config_file = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as exc:
        raise PlannerError(f"cannot read a config.json at {path}: {exc}", "model") from exc
    if not isinstance(config, dict):
        raise PlannerError(f"{config_file} does not hold a JSON object", "model")
    return architecture_from_dict(config, name or (path.name if path.is_dir() else path.parent.name))


def with_parameters(arch: Architecture, num_parameters: int) -> Architecture:
    """`arch` with its total parameter count fixed to `num_parameters` (e.g. a nominal size)."""
    return replace(arch, num_parameters=num_parameters)
