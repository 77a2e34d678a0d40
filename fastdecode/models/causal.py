"""Adapter around any `transformers` causal LM: explicit positions and a trimmable KV cache."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Literal, overload

import torch
from transformers import DynamicCache

from ..cache import KVCache
from .base import ModelAdapter


@dataclass(frozen=True)
class CausalOutput:
    """What `CausalLM.forward(..., hidden=True)` returns: the logits and the features the LM head read.

    `hidden` is transformers' `hidden_states[-1]`, which for language models is tied to `last_hidden_state`: the
    last decoder layer's output *after* the model's final norm (Llama's `model.norm`, GPT-2's `ln_f`), so that
    `lm_head(hidden)` gives the logits (before any logit scaling or soft-capping the architecture applies). It
    covers every input position, also where `num_logits` kept fewer logits, in the model's dtype.
    """

    logits: torch.Tensor  # [B, T', V] float32, T' = num_logits or T
    hidden: torch.Tensor  # [B, T, H] in the model's dtype


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

    @overload
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None,
                attention_mask: torch.Tensor | None = None, num_logits: int | None = None,
                hidden: Literal[False] = False) -> torch.Tensor: ...

    @overload
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, cache: KVCache | None = None,
                attention_mask: torch.Tensor | None = None, num_logits: int | None = None, *,
                hidden: Literal[True]) -> CausalOutput: ...

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T]
        positions: torch.Tensor,  # [B, T]
        cache: KVCache | None = None,
        attention_mask: torch.Tensor | None = None,  # [B, cache.length + T], 0 = padding
        num_logits: int | None = None,  # keep logits of only the last num_logits positions
        hidden: bool = False,  # also return the last hidden states (costs nothing when False)
    ) -> torch.Tensor | CausalOutput:
        """Run the model over `input_ids` appended after `cache`; returns float32 logits `[B, T', V]`, or with
        `hidden=True` a `CausalOutput` holding them and the last hidden states `[B, T, H]`."""
        kwargs = {self._cache_arg: cache.hf if cache is not None else None}
        if num_logits is not None and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = num_logits
        if hidden:
            kwargs["output_hidden_states"] = True
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
        if hidden:
            return CausalOutput(logits.float(), out.hidden_states[-1])
        return logits.float()
