"""The KV cache of a causal LM: grows as the model runs, can be trimmed (rolled back) and reports its length."""

from __future__ import annotations

from typing import Any

from transformers.cache_utils import LinearAttentionCacheLayerMixin

from ..errors import IncompatibleMethodError


class KVCache:
    """Wraps a `transformers` cache object; the model appends to it on every forward.

    `trim(n)` drops the last n positions of every layer, which is what speculative decoding needs to
    roll back rejected draft tokens. Only caches whose layers hold plain `[B, H, T, D]` key/value
    tensors can roll back; `can_trim` declares it so that methods can refuse others when they are built.
    """

    def __init__(self, hf_cache: Any) -> None:
        self.hf = hf_cache

    @property
    def length(self) -> int:
        return int(self.hf.get_seq_length())

    @property
    def can_trim(self) -> bool:
        layers = getattr(self.hf, "layers", None)
        if layers is None:
            return False
        # a layer with a recurrent state (Mamba blocks, FalconH1's hybrid layers, which also hold keys) cannot go back
        return all(
            not getattr(layer, "is_sliding", False) and hasattr(layer, "keys")
            and not isinstance(layer, LinearAttentionCacheLayerMixin)
            for layer in layers
        )

    def trim(self, n: int) -> None:
        """Remove the last `n` cached positions (0 <= n <= length)."""
        if n and not self.can_trim:  # first: a cache of state layers only has no length to check n against
            raise IncompatibleMethodError(
                f"This model's cache ({type(self.hf).__name__}) cannot roll back; use a method that does not need trimming."
            )
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot trim {n} positions from a cache of length {self.length}")
        if n == 0:
            return
        for layer in self.hf.layers:
            if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
                continue
            layer.keys = layer.keys[..., : layer.keys.shape[-2] - n, :]
            layer.values = layer.values[..., : layer.values.shape[-2] - n, :]

    def crop(self, length: int) -> None:
        """Keep only the first `length` positions."""
        self.trim(self.length - length)
