"""Adapter around a masked-diffusion LM (LLaDA, Dream, the zoo's dlm-small): logits for every canvas position."""

from __future__ import annotations

import torch

from .base import ModelAdapter
from .mdlm import LayerKV

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), batch first, over the whole canvas


class MaskedDiffusionLM(ModelAdapter):
    """`forward(canvas)` returns logits aligned so that `logits[:, i]` scores the token at position i.

    Two conventions exist in the wild: LLaDA predicts position i at output i ("same"); Dream, adapted
    from an AR model, predicts position i at output i-1 ("shifted"), so the adapter realigns it.
    """

    kind = "diffusion"

    def __init__(self, model: torch.nn.Module, tokenizer=None, name: str = "", *, mask_token_id: int, shifted: bool) -> None:
        super().__init__(model, tokenizer, name)
        self.mask_token_id = mask_token_id
        self.shifted = shifted

    @property
    def supports_cache(self) -> bool:
        """Whether the model can recompute a subset of columns against cached K/V (`forward_columns`)."""
        return bool(getattr(self.model, "supports_partial_forward", False))

    @torch.inference_mode()
    def forward(
        self,
        canvas: torch.Tensor,  # [B, L]
        attention_mask: torch.Tensor | None = None,  # [B, L], 0 = padding
    ) -> torch.Tensor:
        logits = self.model(input_ids=canvas, attention_mask=attention_mask).logits.float()  # [B, L, V]
        if self.shifted:
            # output i-1 predicts token i; position 0 is always prompt, so its row is a placeholder
            logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        return logits

    @torch.inference_mode()
    def forward_columns(
        self,
        canvas: torch.Tensor,  # [B, L]
        attention_mask: torch.Tensor,  # [B, L]
        columns: torch.Tensor | None,  # [B, Q] columns to compute; None: all (and a fresh cache is returned)
        kv: KV | None,  # the cache to read the other columns from (required with columns)
    ) -> tuple[torch.Tensor, KV]:
        """Aligned logits of `columns` (`[B, Q, V]`, or `[B, L, V]` for all) and the cache, updated with them.

        A shifted model scores column c at output c-1, so it also recomputes c-1 (duplicates are harmless:
        the same column gives the same K/V).
        """
        if columns is None:
            out = self.model(input_ids=canvas, attention_mask=attention_mask, use_cache=True)
            logits = out.logits.float()
            if self.shifted:
                logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
            return logits, [(layer.k, layer.v) for layer in out.cache]
        Q = columns.shape[1]
        query = torch.cat([(columns - 1).clamp(min=0), columns], dim=1) if self.shifted else columns  # [B, Q']
        past = [LayerKV(k, v) for k, v in kv]
        out = self.model(input_ids=canvas.gather(1, query), attention_mask=attention_mask, cache=past,
                         query_index=query, use_cache=True)
        logits = out.logits.float()
        return (logits[:, :Q] if self.shifted else logits), [(layer.k, layer.v) for layer in out.cache]

    def describe(self) -> dict:
        d = super().describe()
        d.update(mask_token_id=self.mask_token_id, logits="shifted (Dream)" if self.shifted else "same position (LLaDA)")
        return d
