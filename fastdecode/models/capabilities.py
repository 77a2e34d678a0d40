"""What a causal LM's layers can do, read from its config and modules before anything runs.

Drivers ask these questions up front so that a method that cannot run on an architecture is refused before the
first step, with the layer type or attention kind that blocks it named in the message:

- `state_layer_types(model)`: recurrent (state-space / linear-attention) layers, whose state cannot roll back;
- `attention_free(model)`: no layer attends over a KV cache (pure state-space models: Mamba, Mamba2);
- `uses_alibi(model)`: ALiBi attention that reads key positions from a 2D padding mask (Bloom, Falcon with alibi, MPT);
- `sliding_windows(model)`: the window of every sliding-window layer (Mistral, Gemma 2/3, Qwen2 with windows);
- `layer_types(model)`: transformers' per-layer cache types ("full_attention", "sliding_attention",
  "linear_attention", ...);
- `check_sparse_attention(model)`: refuse a model whose attention cannot read a subset of the cache.

Each takes a `CausalLM` adapter or a bare `transformers` model.
"""

from __future__ import annotations

from typing import Any

from torch import nn
from transformers.cache_utils import LinearAttentionCacheLayerMixin, get_layer_types_and_kwargs

from ..errors import IncompatibleMethodError

# transformers' cache layer types that attend over plain keys and values; "dummy" layers (MLP / MoE only) hold
# nothing; any other type ("linear_attention", "conv", "hybrid", ...) holds a recurrent state
ATTENTION_LAYER_TYPES = frozenset({"full_attention", "sliding_attention", "chunked_attention", "indexed_attention"})
_STATELESS_LAYER_TYPES = ATTENTION_LAYER_TYPES | {"dummy"}
# recurrent layers that also attend over a KV cache (FalconH1's parallel attention + Mamba2 blocks)
_HYBRID_LAYER_TYPES = frozenset({"hybrid", "hybrid_sliding"})


def _module(model: Any) -> nn.Module:
    return getattr(model, "model", model) if not isinstance(model, nn.Module) else model


def _text_config(model: Any) -> Any:
    config: Any = _module(model).config  # a transformers config (torch types module attributes as Tensor | Module)
    return config.get_text_config(decoder=True)


def layer_types(model: Any) -> list[str]:
    """transformers' cache layer type of every decoder layer, e.g. ["sliding_attention", "full_attention"]; [] when
    the config does not say (a remote-code model transformers cannot read)."""
    try:
        return list(get_layer_types_and_kwargs(_text_config(model))[0])
    except (AttributeError, KeyError, TypeError, ValueError):
        return []


def is_state_layer(layer: Any) -> bool:
    """A cache layer (of a `transformers` cache) that holds a recurrent state, alone or beside keys and values."""
    return isinstance(layer, LinearAttentionCacheLayerMixin)


def state_layer_types(model: Any) -> list[str]:
    """Names of the layer kinds that keep a recurrent state instead of (or beside) a KV cache; [] for pure attention.

    Each name is the mixer module's class where one is found (e.g. "MambaMixer", "JambaMambaMixer") followed by
    transformers' cache layer type, e.g. ["MambaMixer (linear_attention)"].
    """
    types = layer_types(model)
    kinds = sorted({t for t in types if t not in _STATELESS_LAYER_TYPES})
    mixers = sorted({type(m).__name__ for m in _module(model).modules() if _is_mixer(m)})
    if not types and mixers:  # layer types unknown (remote code), but state-space mixers are there
        return mixers
    if not kinds:
        return []
    prefix = ", ".join(mixers)
    return [f"{prefix} ({kind})" if prefix else kind for kind in kinds]


def _is_mixer(module: nn.Module) -> bool:
    """A state-space / linear-attention mixer: it owns the decay parameter `A_log` (Mamba, Mamba2, hybrids,
    GatedDeltaNet)."""
    return "A_log" in dict(module.named_parameters(recurse=False))


def attention_free(model: Any) -> bool:
    """True when no layer attends over a KV cache (a pure state-space model): an attention mask past the prefill
    means nothing to it (Mamba's mixer would even misread one that covers cached positions)."""
    types = layer_types(model)
    return bool(types) and not any(t in ATTENTION_LAYER_TYPES | _HYBRID_LAYER_TYPES for t in types)


def uses_alibi(model: Any) -> bool:
    """ALiBi attention: the bias comes from key positions counted along a 2D padding mask, not from position ids."""
    config = _text_config(model)
    if config.model_type == "bloom":
        return True
    if config.model_type == "mpt":  # MPT keeps the switch in attn_config (a dict or a sub-config), on by default
        attn = getattr(config, "attn_config", None)
        return bool(attn.get("alibi", True) if isinstance(attn, dict) else getattr(attn, "alibi", True))
    return bool(getattr(config, "alibi", False)) or getattr(config, "position_embedding_type", None) == "alibi"


_WINDOWED = ("sliding_attention", "hybrid_sliding", "chunked_attention")


def sliding_windows(model: Any) -> dict[int, int]:
    """{layer index: window} of every sliding-window (or chunked) attention layer; {} when all attend in full."""
    try:
        types, kwargs = get_layer_types_and_kwargs(_text_config(model))
    except (AttributeError, KeyError, TypeError, ValueError):
        return {}
    if isinstance(kwargs, dict):
        # transformers before 5.2x: one dict for every layer, whose window applies to the windowed layer types
        window = kwargs.get("sliding_window")
        if window is None:
            return {}
        return {i: int(window) for i, t in enumerate(types) if t in _WINDOWED}
    return {i: int(kw["sliding_window"]) for i, kw in enumerate(kwargs) if kw.get("sliding_window") is not None}


def check_sparse_attention(model: Any) -> None:
    """Refuse, before the first step, a model whose attention cannot read a subset of the cache: sparse attention
    (`attention=` a rule, `sparse.*`) selects columns of fastdecode's preallocated KV cache through fastdecode's
    attention function, which only an adapter with `preallocated` set runs."""
    if not getattr(model, "preallocated", False):
        raise IncompatibleMethodError(
            f"Sparse attention reads a subset of fastdecode's preallocated KV cache, which "
            f"{getattr(model, 'name', 'this model')!r} cannot use (its layers are not all plain attention through "
            "transformers' attention interface). Use dense attention (ar.greedy, or attention='dense').")
