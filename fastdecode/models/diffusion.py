"""Adapter around a masked-diffusion LM (LLaDA, Dream, the zoo's dlm-small): logits for every canvas position."""

from __future__ import annotations

import torch

from .base import ModelAdapter


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

    def describe(self) -> dict:
        d = super().describe()
        d.update(mask_token_id=self.mask_token_id, logits="shifted (Dream)" if self.shifted else "same position (LLaDA)")
        return d
