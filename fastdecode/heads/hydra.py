"""Hydra heads (Ankner et al. 2024, arXiv 2402.05109): Medusa heads made sequentially dependent.

Head k (0-based) reads the target's last hidden state h_t and the embeddings of the tokens between t and the one it
guesses: the target's own next token x_{t+1} and the k tokens drafted before it, x_{t+2} .. x_{t+k+1}. A linear map
takes that concatenation `[h_t; e(x_{t+1}); ...; e(x_{t+k+1})]` ((k + 2)·H wide) down to H, residual blocks follow,
then the target's lm_head (tied by default, as for Medusa). Knowing the path it extends is what lets head k beat
Medusa's, which has to guess blind; the price is one small forward per draft depth instead of one for all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .base import Head, HeadConfig, Target, register_head
from .medusa import ResBlock, randomise, target_lm_head


@dataclass(frozen=True)
class HydraConfig(HeadConfig):
    hidden_size: int = 0  # the target's hidden size
    vocab_size: int = 0  # the target's vocabulary
    num_heads: int = 4  # tokens guessed past the target's own next token (the deepest draft)
    num_layers: int = 1  # residual blocks per head, after its input map
    tie_lm_head: bool = True  # read logits through the target's lm_head (else each head has its own)


@register_head("hydra")
class HydraHead(Head):
    """Head k: Linear((k + 2)·H -> H) over h_t and the path's token embeddings, residual blocks, lm_head."""

    config_class = HydraConfig
    config: HydraConfig

    def __init__(self, config: HydraConfig, target: Target | None = None) -> None:
        super().__init__(config, target)
        H, V = config.hidden_size, config.vocab_size
        if H <= 0 or V <= 0 or config.num_heads < 1 or config.num_layers < 0:
            raise ValueError(f"a Hydra head needs hidden_size, vocab_size > 0, num_heads >= 1, num_layers >= 0; "
                             f"got {config}")
        inputs = [nn.Linear((k + 2) * H, H) for k in range(config.num_heads)]
        with torch.no_grad():  # start from h_t alone: the identity on its slice, zero on the embeddings'
            for lin in inputs:
                lin.weight.zero_()
                lin.weight[:, :H] = torch.eye(H)
                lin.bias.zero_()
        self.inputs = nn.ModuleList(inputs)
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(H) for _ in range(config.num_layers))) for _ in range(config.num_heads))
        self.lm_heads = (None if config.tie_lm_head else
                         nn.ModuleList(nn.Linear(H, V, bias=False) for _ in range(config.num_heads)))

    @classmethod
    def for_target(cls, model: Any, **options: Any) -> HydraHead:
        """A fresh head shaped for `model`: each head starts as the target's next-token guess from h_t."""
        config = HydraConfig(hidden_size=int(model.config.hidden_size), vocab_size=int(model.config.vocab_size),
                             **options)
        head = cls(config, Target.of(model))
        if head.lm_heads is not None:
            with torch.no_grad():
                for weight in head.lm_heads.parameters():  # one weight a head, no bias
                    weight.copy_(target_lm_head(model).float())
        return head

    @classmethod
    def untrained(cls, model: Any, seed: int = 0) -> HydraHead:
        return randomise(cls.for_target(model), seed)  # type: ignore[return-value]

    def head_logits(self, k: int, hidden: torch.Tensor, path: torch.Tensor,
                    lm_head: torch.Tensor | None = None) -> torch.Tensor:
        """Head k's logits `[..., V]` from h_t `[..., H]` and the path's embeddings `[..., k + 1, H]`, x_{t+1}
        first."""
        if path.shape[-2] != k + 1:
            raise ValueError(f"Hydra head {k} reads {k + 1} token embeddings, got {path.shape[-2]}")
        x = torch.cat([hidden, path.flatten(-2)], dim=-1)  # [..., (k + 2) H]
        feats = self.blocks[k](self.inputs[k](x))  # [..., H]
        if self.lm_heads is not None:
            return self.lm_heads[k](feats)
        if lm_head is None:
            raise ValueError("this Hydra head reads the target's lm_head: pass it (heads.medusa.target_lm_head)")
        return feats @ lm_head.to(feats.dtype).T
