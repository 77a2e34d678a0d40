"""Hydra heads (Ankner et al. 2024, arXiv 2402.05109): Medusa heads made sequentially dependent.

Head k (0-based) reads the target's last hidden state h_t and the embeddings of the tokens between t and the one it
guesses: the target's own next token x_{t+1} and the k tokens drafted before it, x_{t+2} .. x_{t+k+1}. A linear map
takes that concatenation `[h_t; e(x_{t+1}); ...; e(x_{t+k+1})]` ((k + 2)·H wide) down to H, residual blocks follow,
then the target's lm_head (tied by default, as for Medusa). Knowing the path it extends is what lets head k beat
Medusa's, which has to guess blind; the price is one small forward per draft depth instead of one for all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .base import Target, register_head
from .medusa import MedusaConfig, TiedHeads


@dataclass(frozen=True)
class HydraConfig(MedusaConfig):
    """Medusa's fields; `num_layers` counts the residual blocks after each head's input map."""


@register_head("hydra")
class HydraHead(TiedHeads):
    """Head k: Linear((k + 2)·H -> H) over h_t and the path's token embeddings, residual blocks, lm_head."""

    config_class = HydraConfig
    config: HydraConfig

    def __init__(self, config: HydraConfig, target: Target | None = None) -> None:
        super().__init__(config, target)
        self._check(config)
        H = config.hidden_size
        inputs = [nn.Linear((k + 2) * H, H) for k in range(config.num_heads)]
        with torch.no_grad():  # start from h_t alone: the identity on its slice, zero on the embeddings'
            for lin in inputs:
                lin.weight.zero_()
                lin.weight[:, :H] = torch.eye(H)
                lin.bias.zero_()
        self.inputs = nn.ModuleList(inputs)
        self._build_blocks(config)

    def head_logits(self, k: int, hidden: torch.Tensor, path: torch.Tensor,
                    lm_head: torch.Tensor | None = None) -> torch.Tensor:
        """Head k's logits `[..., V]` from h_t `[..., H]` and the path's embeddings `[..., k + 1, H]`, x_{t+1}
        first."""
        if path.shape[-2] != k + 1:
            raise ValueError(f"Hydra head {k} reads {k + 1} token embeddings, got {path.shape[-2]}")
        x = torch.cat([hidden, path.flatten(-2)], dim=-1)  # [..., (k + 2) H]
        return self.read_logits(k, self.blocks[k](self.inputs[k](x)), lm_head)
