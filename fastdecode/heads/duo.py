"""DuoAttention's gates (Xiao et al. 2025): one value alpha in [0, 1] per (layer, key/value head) of a causal LM.

Trained with the model frozen (`fastdecode train duo`, `fastdecode/train/duo.py`): each head's output is
alpha * full attention + (1 - alpha) * streaming attention (the first `sinks` tokens and the last `window`), and
the gates learn how much of the full attention each head needs. `sparse.duo` keeps the heads with the largest gates
dense (retrieval heads) and lets the others stream. The config records the streaming pattern the gates were trained
with and the fingerprint of the weights they were trained on, so that gates of an older model are not used on a
retrained one of the same shape (`sparse.duo` falls back to its far-mass ranking then).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .base import Head, HeadConfig, Target, register_head


@dataclass(frozen=True)
class DuoGatesConfig(HeadConfig):
    layers: int = 1
    kv_heads: int = 1
    sinks: int = 128  # the streaming pattern the gates were trained against (the authors' train.sh: 128 + 256)
    window: int = 256
    weights_sha256: str = ""  # sha256 of the target's weights file ("" = unknown: not checked)


@register_head("duo")
class DuoGates(Head):
    """`alpha` `[layers, kv_heads]`: the gates, initialised to 1 (every head full, as the authors start)."""

    config_class = DuoGatesConfig
    config: DuoGatesConfig

    def __init__(self, config: DuoGatesConfig, target: Target | None = None) -> None:
        super().__init__(config, target)
        self.alpha = nn.Parameter(torch.ones(config.layers, config.kv_heads))

    @classmethod
    def for_target(cls, model: Any, **options: Any) -> DuoGates:
        config = model.config
        layers = int(config.num_hidden_layers)
        kv = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        return cls(DuoGatesConfig(layers=layers, kv_heads=kv, **options), Target.of(model))

    def fits(self, model: Any) -> bool:
        """Whether these gates were trained on `model`'s weights (True when either fingerprint is unknown)."""
        found = weights_fingerprint(model)
        return not (self.config.weights_sha256 and found) or found == self.config.weights_sha256

    def gates(self) -> torch.Tensor:
        """`[layers, kv_heads]` float32 in [0, 1]."""
        return self.alpha.detach().float().clamp(0, 1)


def weights_fingerprint(model: Any) -> str:
    """sha256 of the weights file of `model`'s folder ("" for a model built in memory); kept on the model object."""
    known = getattr(model, "_weights_sha256", None)
    if known is not None:
        return str(known)
    digest = ""
    try:
        from ..models.loading import resolve

        path = resolve(str(getattr(model, "name", ""))) / "model.safetensors"
        if path.is_file():
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except Exception:  # no folder (a model built in memory, or a sharded one): unknown
        digest = ""
    model._weights_sha256 = digest
    return digest
