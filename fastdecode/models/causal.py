"""Adapter around any `transformers` causal LM: explicit positions and a trimmable KV cache."""

from __future__ import annotations

import inspect

import torch
from transformers import DynamicCache

from ..cache import KVCache
from .base import ModelAdapter


class CausalLM(ModelAdapter):
    kind = "causal"

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        params = inspect.signature(self.model.forward).parameters
        self._has_logits_to_keep = "logits_to_keep" in params
        # transformers 5.24 renamed the forward argument `past_key_values` to `cache` (the old name warns)
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def new_cache(self) -> KVCache:
        return KVCache(DynamicCache(config=self.config))

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T]
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,  # [B, cache.length + T], 0 = padding
        num_logits: int | None = None,  # keep logits of only the last num_logits positions
    ) -> torch.Tensor:
        """Run the model over `input_ids` appended after `cache`; returns float32 logits `[B, T', V]`."""
        kwargs = {self._cache_arg: cache.hf if cache is not None else None}
        if num_logits is not None and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = num_logits
        out = self.model(
            input_ids=input_ids,
            position_ids=positions,
            attention_mask=attention_mask,
            use_cache=cache is not None,
            **kwargs,
        )
        logits = out.logits
        if num_logits is not None:
            logits = logits[:, -num_logits:]
        return logits.float()
